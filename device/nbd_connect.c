/* mloop — opening negotiated connections to an export on a Unix socket. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <unistd.h>

#include "errmsg.h"
#include "nbd_connect.h"
#include "nbd_proto.h"

#define HANDSHAKE_TIMEOUT_S 30

/* Handshake timeouts, so a server that hangs mid-handshake does not hang
 * us; cleared once negotiated, when the kernel takes the socket over.
 */
static void
set_timeouts (int fd, int seconds)
{
  struct timeval tv = { .tv_sec = seconds };

  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int
connect_unix (const char *path, char *err, size_t errlen)
{
  struct sockaddr_un addr = { .sun_family = AF_UNIX };
  int fd;

  if (strlen (path) >= sizeof addr.sun_path)
    return mloop_fail (err, errlen, "socket path too long: %s", path);
  strcpy (addr.sun_path, path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &addr, sizeof addr) == -1) {
    mloop_fail (err, errlen, "cannot connect to %s: %s", path, strerror (errno));
    if (fd != -1)
      close (fd);
    return -1;
  }
  return fd;
}

static int
connect_tcp (const char *host, const char *port, char *err, size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
  struct addrinfo *res, *ai;
  int fd = -1, r, saved = 0;

  r = getaddrinfo (host, port, &hints, &res);
  if (r != 0)
    return mloop_fail (err, errlen, "%s:%s: %s", host, port, gai_strerror (r));
  for (ai = res; ai && fd == -1; ai = ai->ai_next) {
    fd = socket (ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                 ai->ai_protocol);
    if (fd != -1 && connect (fd, ai->ai_addr, ai->ai_addrlen) == -1) {
      saved = errno;
      close (fd);
      fd = -1;
    }
  }
  freeaddrinfo (res);
  if (fd == -1)
    return mloop_fail (err, errlen, "cannot connect to %s:%s: %s", host, port,
                 strerror (saved ? saved : errno));
  /* Requests are small and latency-bound: no Nagle delay. */
  setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &(int) { 1 }, sizeof (int));
  return fd;
}

static int
connect_address (const struct mloop_nbd_address *a, char *err, size_t errlen)
{
  int fd = a->unix_path ? connect_unix (a->unix_path, err, errlen)
    : connect_tcp (a->host, a->port, err, errlen);

  if (fd != -1)
    set_timeouts (fd, HANDSHAKE_TIMEOUT_S);
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

/* Returns how many connections were opened and negotiated, or -1. */
static int
negotiate_all (const struct mloop_nbd_address *a, unsigned n, bool strict,
               int *fds, struct mloop_nbd_export *x, char *err,
               size_t errlen)
{
  char why[256];

  for (unsigned i = 0; i < n; i++) {
    struct mloop_nbd_export xi = { 0 };

    fds[i] = connect_address (a, err, errlen);
    if (fds[i] == -1)
      return -1;
    if (mloop_nbd_client_go (fds[i], a->name, &xi, why, sizeof why) == -1)
      return mloop_fail (err, errlen, "connection %u: %s", i + 1, why);
    set_timeouts (fds[i], 0);   /* the kernel sets its own */
    if (i == 0) {
      *x = xi;
      if (n > 1 && !(x->flags & NBD_FLAG_CAN_MULTI_CONN)) {
        if (strict)
          return mloop_fail (err, errlen, "the server does not advertise "
                       "multi-conn: attach it with --connections 1");
        return 1;
      }
    }
    else if (xi.size != x->size || xi.flags != x->flags)
      return mloop_fail (err, errlen, "connection %u saw a different export",
                   i + 1);
  }
  return (int) n;
}

int
mloop_nbd_connect (const struct mloop_nbd_address *a, unsigned n,
                   bool strict, int *fds, struct mloop_nbd_export *x,
                   char *err, size_t errlen)
{
  int r;

  for (unsigned i = 0; i < n; i++)
    fds[i] = -1;
  r = negotiate_all (a, n, strict, fds, x, err, errlen);
  if (r == -1)
    mloop_nbd_close_all (fds, n);
  return r;
}

int
mloop_nbd_connect_unix (const char *socket_path, unsigned n, int *fds,
                        struct mloop_nbd_export *x, char *err, size_t errlen)
{
  struct mloop_nbd_address a = { .unix_path = socket_path, .name = "" };

  return mloop_nbd_connect (&a, n, true, fds, x, err, errlen) == -1 ? -1 : 0;
}
