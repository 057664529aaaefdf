/* mloop — opening negotiated connections to an export on a Unix socket. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "nbd_connect.h"
#include "nbd_proto.h"

#define HANDSHAKE_TIMEOUT_S 30

static int __attribute__((format (printf, 3, 4)))
fail (char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (err, errlen, fmt, ap);
  va_end (ap);
  return -1;
}

static int
connect_unix (const char *path, char *err, size_t errlen)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  struct timeval tv = { .tv_sec = HANDSHAKE_TIMEOUT_S };
  int fd;

  if (strlen (path) >= sizeof addr.sun_path)
    return fail (err, errlen, "socket path too long: %s", path);
  strcpy (addr.sun_path, path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    fail (err, errlen, "cannot connect to %s: %s", path, strerror (errno));
    if (fd != -1)
      close (fd);
    return -1;
  }
  /* A server that hangs mid-handshake must not hang us. */
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

void
mloop_nbd_close_all (int *fds, unsigned n)
{
  for (unsigned i = 0; i < n; i++)
    if (fds[i] != -1) {
      close (fds[i]);
      fds[i] = -1;
    }
}

static int
negotiate_all (const char *sock, unsigned n, int *fds,
               struct mloop_nbd_export *x, char *err, size_t errlen)
{
  char why[256];

  for (unsigned i = 0; i < n; i++) {
    struct mloop_nbd_export xi = { 0 };
    struct timeval none = { 0 };

    fds[i] = connect_unix (sock, err, errlen);
    if (fds[i] == -1)
      return -1;
    if (mloop_nbd_client_go (fds[i], "", &xi, why, sizeof why) == -1)
      return fail (err, errlen, "connection %u: %s", i + 1, why);
    if (i == 0) {
      *x = xi;
      if (n > 1 && !(x->flags & NBD_FLAG_CAN_MULTI_CONN))
        return fail (err, errlen, "the server does not advertise multi-conn: "
                     "attach it with --connections 1");
    }
    else if (xi.size != x->size || xi.flags != x->flags)
      return fail (err, errlen, "connection %u saw a different export",
                   i + 1);
    /* From here the kernel owns the socket and its own timeouts. */
    setsockopt (fds[i], SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    setsockopt (fds[i], SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  }
  return 0;
}

int
mloop_nbd_connect_unix (const char *socket_path, unsigned n, int *fds,
                        struct mloop_nbd_export *x, char *err, size_t errlen)
{
  for (unsigned i = 0; i < n; i++)
    fds[i] = -1;
  if (negotiate_all (socket_path, n, fds, x, err, errlen) == -1) {
    mloop_nbd_close_all (fds, n);
    return -1;
  }
  return 0;
}
