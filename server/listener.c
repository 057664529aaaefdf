/* mloop-server — the listening socket. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "listener.h"

static int
open_unix (struct listener *l, const char *path, char *err, size_t errlen)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };

  if (strlen (path) >= sizeof sun.sun_path) {
    snprintf (err, errlen, "--listen unix:%s: path too long", path);
    return -1;
  }
  strcpy (sun.sun_path, path);
  l->fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd == -1) {
    snprintf (err, errlen, "socket: %s", strerror (errno));
    return -1;
  }
  /* bind() fails with EADDRINUSE on an existing path: never remove a
   * file we did not create (it may be another server's live socket).
   */
  if (bind (l->fd, (struct sockaddr *) &sun, sizeof sun) == -1) {
    snprintf (err, errlen, "--listen unix:%s: %s", path, strerror (errno));
    close (l->fd);
    return -1;
  }
  l->unix_path = strdup (path);
  return 0;
}

static int
open_tcp (struct listener *l, const char *hostport, char *err, size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
  struct addrinfo *ai = NULL;
  char *host = strdup (hostport), *port;
  int one = 1, r;

  if (host == NULL) {
    snprintf (err, errlen, "%s", strerror (errno));
    return -1;
  }
  port = strrchr (host, ':');
  if (port == NULL || port[1] == '\0') {
    snprintf (err, errlen, "--listen tcp:%s: expected tcp:HOST:PORT",
              hostport);
    free (host);
    return -1;
  }
  *port++ = '\0';
  /* [::1]:10809 style */
  if (host[0] == '[' && host[strlen (host) - 1] == ']') {
    memmove (host, host + 1, strlen (host));
    host[strlen (host) - 1] = '\0';
  }
  r = getaddrinfo (*host ? host : NULL, port, &hints, &ai);
  if (r != 0) {
    snprintf (err, errlen, "--listen tcp:%s: %s", hostport, gai_strerror (r));
    free (host);
    return -1;
  }
  l->fd = socket (ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd == -1 ||
      setsockopt (l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == -1 ||
      bind (l->fd, ai->ai_addr, ai->ai_addrlen) == -1) {
    snprintf (err, errlen, "--listen tcp:%s: %s", hostport, strerror (errno));
    if (l->fd >= 0)
      close (l->fd);
    freeaddrinfo (ai);
    free (host);
    return -1;
  }
  freeaddrinfo (ai);
  free (host);
  return 0;
}

int
listener_open (struct listener *l, const char *spec, char *err, size_t errlen)
{
  int r;

  l->fd = -1;
  l->unix_path = NULL;
  if (strncmp (spec, "unix:", 5) == 0)
    r = open_unix (l, spec + 5, err, errlen);
  else if (strncmp (spec, "tcp:", 4) == 0)
    r = open_tcp (l, spec + 4, err, errlen);
  else {
    snprintf (err, errlen, "--listen %s: expected unix:PATH or tcp:HOST:PORT",
              spec);
    return -1;
  }
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
