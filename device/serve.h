/* mloop — `mloop serve`: an image served to other machines.
 *
 * Serving is a long-running foreground process, so this only decides the
 * command line (the native mloop-server, or nbdkit with the mloop plugin
 * when TLS or --server nbdkit is asked for) and prepares the socket's
 * directory; the caller execs it.  Never prints.
 */
#ifndef MLOOP_SERVE_H
#define MLOOP_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server_kind.h"

struct mloop_serve_request {
  const char *file;
  uint64_t offset, sizelimit;   /* the window served (server_kind.h) */
  const char *listen;           /* unix:PATH or tcp:HOST:PORT */
  const char *export_name;      /* NULL: the default export "" */
  bool read_only;
  unsigned threads;             /* 0: the server's default */
  unsigned max_connections;     /* 0: no cap */
  unsigned max_per_client;      /* 0: no cap; the native server only */
  const char *keepalive;        /* NULL: default; the native server only */
  enum mloop_tls_mode tls;
  const char *tls_psk;          /* PSK file (nbdkit's format) */
  const char *tls_certificates; /* directory of PEM files */
  bool tls_verify_peer;         /* clients need a certificate the CA signed */
  /* NULL: the default server, or one that serves TLS when TLS is on. */
  const struct mloop_server_kind *server;
};

/* 0 and *MODE for "off", "on" or "require"; -1 otherwise. */
int mloop_tls_mode_parse (const char *s, enum mloop_tls_mode *mode);

/* Checks REQ, creates a Unix socket's directory (0700) when missing, and
 * returns the server's argv (NULL-terminated, g_strfreev it), or NULL
 * with ERR.
 */
char **mloop_serve_command (const struct mloop_serve_request *req,
                            char *err, size_t errlen);

#endif /* MLOOP_SERVE_H */
