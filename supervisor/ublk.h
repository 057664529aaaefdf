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
 * the NBD modes.
 *
 *   mloop-supervisor --dir DIR --ublk [--queues N] [--read-only]
 *                    [--block-size N] [--offset N] [--sizelimit N]
 *                    [--id N] [--dead-timeout S] IMAGE
 */
#ifndef MLOOP_SUPERVISOR_UBLK_H
#define MLOOP_SUPERVISOR_UBLK_H

#include "ublk_device.h"

/* Runs until SIGTERM/SIGINT; returns the exit status.  DEAD_TIMEOUT_S:
 * how long the device may be without a server before it is stopped.
 * ADOPTED, unless 0: the first mloop-ublk, started as our child.
 */
int mloop_supervise_ublk (const char *dir, const struct mloop_ublk_spec *spec,
                          unsigned dead_timeout_s, pid_t adopted);

#endif /* MLOOP_SUPERVISOR_UBLK_H */
