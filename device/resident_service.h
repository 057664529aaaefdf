/* mloop — asking mloopd, the resident service, to keep a device's server
 * (supervisor/mloopd.c says what it answers).
 *
 * Where mloopd listens (systemd starts it on first use, through its
 * socket), `mloop attach` asks it to keep a local image's server instead
 * of starting a mloop-supervisor of its own: one process for every
 * device instead of one per device.  Where it does not, every device
 * has its supervisor as before.  The state says which
 * (service_kept), and detach, resize and status follow it.
 */
#ifndef MLOOP_RESIDENT_SERVICE_H
#define MLOOP_RESIDENT_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "message.h"
#include "nbd_client.h"
#include "server_process.h"

/* The control socket's name in mloop's runtime directory. */
#define MLOOP_SERVICE_SOCKET "mloopd.sock"
/* The file mloopd holds an flock on for its life: one mloopd per
 * runtime directory.  Left in place (removing it would let two lock two
 * files); it is no device's.
 */
#define MLOOP_SERVICE_LOCK "mloopd.lock"

/* What mloopd answers a keep. */
struct mloop_service_kept {
  pid_t server;                 /* the server's pid; mloopd's own when */
  bool in_process;              /* it serves inside mloopd */
  /* Served inside mloopd: the connections asked for, which need no
   * handshake, and the export they are to (what a handshake would have
   * said).  n_fds is 0 when there are none: the attach then connects
   * through the device's socket.
   */
  int fds[MLOOP_CONTROL_MAX_FDS];
  unsigned n_fds;
  struct mloop_nbd_export export;
};

/* Asks mloopd to start the server SPEC describes for the device whose
 * directory is DIR and keep it (the paths in SPEC must be DIR's own),
 * and, should it serve the device inside itself, for CONNECTIONS
 * connections to it.  1 with *KEPT, 0 when no mloopd listens here, -1
 * with ERR (its refusal: a server that did not start, in the server's
 * words).
 */
int mloop_service_keep (const struct mloop_server_spec *spec,
                        const char *dir, unsigned connections,
                        struct mloop_service_kept *kept, char *err,
                        size_t errlen);

/* Asks mloopd to keep the device whose directory is DIR on the remote
 * export URI (it reconnects the connections the kernel drops): 1, 0
 * when no mloopd listens here, -1 with ERR.
 */
int mloop_service_keep_remote (const char *uri, const char *dir, char *err,
                               size_t errlen);

/* Asks mloopd to stop DIR's server and forget the device; 0, or -1 with
 * ERR.
 */
int mloop_service_drop (const char *dir, char *err, size_t errlen);

/* Asks mloopd for a planned restart of DIR's server (an nbdkit's, for a
 * new size); its outcome is recorded as a supervisor's is.  0, or -1
 * with ERR.
 */
int mloop_service_restart (const char *dir, char *err, size_t errlen);

/* Whether mloopd keeps DIR's device now. */
bool mloop_service_keeps (const char *dir);

#endif /* MLOOP_RESIDENT_SERVICE_H */
