/* mloop-server — the listening socket. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "address.h"
#include "listener.h"

/* bind() found something at SUN's path.  A socket nobody listens on
 * (connect is refused: left by a server that was killed, say by the OOM
 * killer under a unit that restarts it) is removed, so the restart can
 * listen; anything else is never touched: another server's live socket,
 * or a file that is not a socket.  0 when removed; -1 with errno
 * EADDRINUSE otherwise.  (A server between its bind and its listen is
 * refused too: two servers started on one path at the same moment is
 * the one case this cannot tell from a dead one.)
 */
static int
replace_stale_socket (const struct sockaddr_un *sun, const char *spec)
{
  struct stat st;
  int probe, refused;

  if (lstat (sun->sun_path, &st) == -1 || !S_ISSOCK (st.st_mode)) {
    errno = EADDRINUSE;
    return -1;
  }
  probe = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe == -1) {
    errno = EADDRINUSE;
    return -1;
  }
  refused = connect (probe, (const struct sockaddr *) sun, sizeof *sun) == -1 &&
    errno == ECONNREFUSED;
  close (probe);
  if (!refused || unlink (sun->sun_path) == -1) {
    errno = EADDRINUSE;
    return -1;
  }
  fprintf (stderr, "mloop-server: --listen %s: replaced a stale socket "
           "(nothing was listening on it)\n", spec);
  return 0;
}

static int
open_unix (struct listener *l, const char *spec, const char *path,
           char *err, size_t errlen)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };

  strcpy (sun.sun_path, path);  /* the parser checked its length */
  l->fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd == -1) {
    snprintf (err, errlen, "socket: %s", strerror (errno));
    return -1;
  }
  if (bind (l->fd, (struct sockaddr *) &sun, sizeof sun) == -1 &&
      (errno != EADDRINUSE || replace_stale_socket (&sun, spec) == -1 ||
       bind (l->fd, (struct sockaddr *) &sun, sizeof sun) == -1)) {
    snprintf (err, errlen, "--listen %s: %s", spec, strerror (errno));
    close (l->fd);
    return -1;
  }
  l->unix_path = strdup (path);
  return 0;
}

/* An empty HOST listens on every address. */
static int
open_tcp (struct listener *l, const char *spec, const char *host,
          const char *port, char *err, size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
  struct addrinfo *ai = NULL;
  int one = 1, r;

  r = getaddrinfo (*host ? host : NULL, port, &hints, &ai);
  if (r != 0) {
    snprintf (err, errlen, "--listen %s: %s", spec, gai_strerror (r));
    return -1;
  }
  l->fd = socket (ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd == -1 ||
      setsockopt (l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == -1 ||
      bind (l->fd, ai->ai_addr, ai->ai_addrlen) == -1) {
    snprintf (err, errlen, "--listen %s: %s", spec, strerror (errno));
    if (l->fd >= 0)
      close (l->fd);
    freeaddrinfo (ai);
    return -1;
  }
  freeaddrinfo (ai);
  return 0;
}

int
listener_open (struct listener *l, const char *spec, char *err, size_t errlen)
{
  struct mloop_nbd_address a;
  char why[256];
  int r;

  l->fd = -1;
  l->unix_path = NULL;
  if (mloop_nbd_address_parse (spec, MLOOP_NBD_ADDRESS_LISTEN, &a,
                               why, sizeof why) == -1) {
    snprintf (err, errlen, "--listen %s", why);
    return -1;
  }
  if (a.unix_path)
    r = open_unix (l, spec, a.unix_path, err, errlen);
  else
    r = open_tcp (l, spec, a.host, a.port, err, errlen);
  mloop_nbd_address_clear (&a);
  if (r == 0 && listen (l->fd, SOMAXCONN) == -1) {
    snprintf (err, errlen, "listen: %s", strerror (errno));
    listener_close (l);
    return -1;
  }
  return r;
}

void
listener_close (struct listener *l)
{
  if (l->fd >= 0)
    close (l->fd);
  l->fd = -1;
  if (l->unix_path)
    unlink (l->unix_path);
  free (l->unix_path);
  l->unix_path = NULL;
}
