/* mloop — the servers mloop runs, one row of a table each: mloop-server
 * ("native", the default) and nbdkit with the mloop plugin ("nbdkit").
 *
 * A row holds what differs between them: the name that --server, the
 * state file and `mloop list` use, whether it serves TLS, whether it
 * daemonizes, and how its command line is written.  One command line
 * serves both a device (server_process.h: a private Unix socket, in the
 * background) and an export (serve.h: where the user says, in the
 * foreground).  A device on another machine's export runs no server of
 * ours (mloop_device_state.remote), so it is not a kind.  Never prints.
 */
#ifndef MLOOP_SERVER_KIND_H
#define MLOOP_SERVER_KIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include "address.h"

enum mloop_tls_mode { MLOOP_TLS_OFF, MLOOP_TLS_ON, MLOOP_TLS_REQUIRE };

/* What a server serves, where and how. */
struct mloop_server_config {
  const char *image;
  /* The window of IMAGE served, like losetup's: from byte OFFSET, at
   * most SIZELIMIT bytes (0: to the end).
   */
  uint64_t offset, sizelimit;
  /* A copy-on-write overlay IMAGE's writes go to (engine/overlay.h), or
   * NULL: IMAGE itself is written.
   */
  const char *overlay;
  /* Refuse to serve when there is no file at OVERLAY, rather than make
   * an empty one (engine.h): every start of a device's server but its
   * first.
   */
  bool overlay_must_exist;
  /* For an RBD image: where its servers record the exclusive lock's
   * holder (engine.h's lock_record), or NULL.
   */
  const char *lock_record;
  /* For an RBD image: fail a request the cluster has not answered in
   * this many seconds with EIO (engine.h's io_timeout); 0: wait.
   */
  unsigned io_timeout;
  const struct mloop_nbd_address *listen;  /* a Unix socket, or TCP */
  const char *pid_file;         /* written once listening, or NULL */
  const char *stats_file;       /* request counters (stats.h), or NULL */
  const char *export_name;      /* NULL: the server's default */
  unsigned threads;             /* IO workers; 0 = the server's default */
  /* Connections open at once, in all and per client address; 0: no cap
   * (per client: only for a kind with .per_client_cap).
   */
  unsigned max_connections, max_per_client;
  /* TCP keepalive as IDLE:INTERVAL:COUNT or "off" (mloop-server's
   * --keepalive), or NULL: the server's default.  Only for a kind with
   * .keepalive_settings.
   */
  const char *keepalive;
  bool read_only;
  /* The process started is the server, for as long as it serves.
   * Otherwise a kind that daemonizes may fork and exit.
   */
  bool foreground;
  enum mloop_tls_mode tls;      /* only for a kind with .tls */
  const char *tls_psk;          /* PSK file (nbdkit's format), or NULL */
  const char *tls_certificates; /* directory of PEM files, or NULL */
  bool tls_verify_peer;         /* clients need a certificate the CA signed */
  /* The kernel's NBD client is the only client (a device's own server):
   * mloop-server then sends large READ data by page reference (its
   * --splice), which pays for the kernel's receive path.
   */
  bool kernel_client;
};

struct mloop_server_kind {
  const char *name;
  bool tls;                     /* can serve TLS */
  bool per_client_cap;          /* can cap connections per client address */
  bool keepalive_settings;      /* takes TCP keepalive settings */
  /* Started in the background, the process exits 0 once its daemon
   * listens: the pid file names the server.
   */
  bool daemonizes;
  /* How many requests of one connection it works on at once.  A device
   * it serves gets this queue depth, so no request sits unseen in the
   * server while the kernel's request timeout runs (docs/design.md,
   * "Timeouts").
   */
  unsigned requests_at_once;
  /* Re-reads the image's size on SIGHUP and serves it to every request
   * from then on (mloop-server).  nbdkit keeps the size each connection
   * negotiated, so after a resize its supervisor restarts it instead
   * (resize.h).
   */
  bool resizes_on_sighup;
  /* Appends the program and its arguments serving C to ARGV. */
  void (*command) (const struct mloop_server_config *c, GPtrArray *argv);
};

/* The default kind: mloop-server. */
const struct mloop_server_kind *mloop_server_kind_default (void);
/* The first kind that serves TLS. */
const struct mloop_server_kind *mloop_server_kind_tls (void);

/* The kind called NAME; NULL with ERR ("NAME: must be native or
 * nbdkit") when there is none.
 */
const struct mloop_server_kind *mloop_server_kind_find (const char *name,
                                                        char *err,
                                                        size_t errlen);

/* KIND's command line for C, NULL-terminated (g_strfreev it). */
char **mloop_server_command (const struct mloop_server_kind *kind,
                             const struct mloop_server_config *c);

#endif /* MLOOP_SERVER_KIND_H */
