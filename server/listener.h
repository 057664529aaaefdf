/* mloop-server — the listening socket: unix:PATH or tcp:HOST:PORT, as
 * nbd/address.h parses them.
 */
#ifndef MLOOP_SERVER_LISTENER_H
#define MLOOP_SERVER_LISTENER_H

#include <stddef.h>

struct listener {
  int fd;
  char *unix_path;              /* removed again by listener_close */
};

/* Binds and listens on SPEC.  Refuses to replace an existing file at a
 * Unix socket path.  Returns 0, or -1 with a one-line reason in ERR.
 */
int listener_open (struct listener *l, const char *spec,
                   char *err, size_t errlen);
void listener_close (struct listener *l);

#endif /* MLOOP_SERVER_LISTENER_H */
