/* mloop-supervisor — the ublk mode: a device served by mloop-ublk.
 *
 * It starts mloop-ublk, which makes /dev/ublkbN with ublk's user
 * recovery, and when that process dies it starts another with --recover:
 * the kernel held the device's IO meanwhile, and gives the requests the
 * dead one had taken to the new one (UBLK_F_USER_RECOVERY_REISSUE), so
 * nothing acknowledged is lost and nothing in flight fails.  Tries again
 * with backoff until one takes over (the kernel refuses a recovery until
 * the dead process has let go of /dev/ublkcN).  An mloop-ublk that
 * exits 0 was asked to stop by someone else and deleted its device:
 * then the supervisor stops too.  When none has taken the device over
 * within the dead timeout (the image is gone, say), it stops the device,
 * so that its IO fails with EIO instead of waiting for ever, and stops
 * too.  A recovery runs beside the event loop, never inside it: one
 * stuck in the kernel or on a hanging image does not hold up SIGTERM
 * or the dead timeout.  Restarts are recorded for `mloop status`, as in
 * the NBD modes.  All of it runs as sources on the default main
 * context, so one process may hold many.
 *
 *   mloop-supervisor --dir DIR --ublk [--queues N] [--read-only]
 *                    [--block-size N] [--offset N] [--sizelimit N]
 *                    [--id N] [--dead-timeout S] IMAGE
 */
#ifndef MLOOP_SUPERVISOR_UBLK_H
#define MLOOP_SUPERVISOR_UBLK_H

#include <stdio.h>
#include <sys/types.h>

#include "ublk_device.h"

struct ublk_keeper;

/* A keeper for the device whose directory is DIR, served as SPEC says
 * (copied, its strings too); DEAD_TIMEOUT_S: how long the device may be
 * without a server before it is stopped.  It logs to LOG, and calls
 * ENDED (UK, DATA) when there is nothing left to keep (the device was
 * stopped from outside, or given up): the owner stops it then, from its
 * main loop, not inside the call.
 */
struct ublk_keeper *
ublk_keeper_new (const char *dir, const struct mloop_ublk_spec *spec,
                 unsigned dead_timeout_s, FILE *log,
                 void (*ended) (struct ublk_keeper *uk, void *data),
                 void *data);

/* Starts the first mloop-ublk, which makes the device (ADOPTED, unless
 * 0: one started as our child, side_by_side.h), and returns once it
 * serves: 0, or -1 with ERR, the attach's failure.
 */
int ublk_keeper_start (struct ublk_keeper *uk, pid_t adopted, char *err,
                       size_t errlen);

/* Stops mloop-ublk (which deletes its device) and every source of UK,
 * and frees it.
 */
void ublk_keeper_stop (struct ublk_keeper *uk);

#endif /* MLOOP_SUPERVISOR_UBLK_H */
