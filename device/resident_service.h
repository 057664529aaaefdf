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

#include "server_process.h"

/* The control socket's name in mloop's runtime directory. */
#define MLOOP_SERVICE_SOCKET "mloopd.sock"
/* The file mloopd holds an flock on for its life: one mloopd per
 * runtime directory.  Left in place (removing it would let two lock two
 * files); it is no device's.
 */
#define MLOOP_SERVICE_LOCK "mloopd.lock"

/* Asks mloopd to start the server SPEC describes for the device whose
 * directory is DIR and keep it (the paths in SPEC must be DIR's own).
 * 1 with *SERVER (its pid) and *IN_PROCESS (it serves inside mloopd,
 * SERVER being mloopd's pid), 0 when no mloopd listens here, -1 with
 * ERR (its refusal: a server that did not start, in the server's words).
 */
int mloop_service_keep (const struct mloop_server_spec *spec,
                        const char *dir, pid_t *server, bool *in_process,
                        char *err, size_t errlen);

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
