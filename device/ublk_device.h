/* mloop — an image attached through ublk (/dev/ublkbN) instead of NBD.
 *
 * The kernel's ublk driver (ublk_drv, Linux 6.0 and later) hands each
 * request of /dev/ublkbN to a process through io_uring: no socket, no
 * server protocol.  mloop-ublk (ublk/) is that process; it creates the
 * device, serves it on the IO engine the NBD servers use, and deletes
 * it when stopped.  Attach starts it detached, like a server, in the
 * device's directory (device_state.h); detach stops it, and deletes the
 * device itself if mloop-ublk was killed and left it behind.
 *
 * Not yet for ublk: a remote image (NBD carries it), a chosen device
 * number, request timeouts, autoclear, queue settings, --no-partscan,
 * resize, and restarts after a crash (ublk's user recovery).  Each is
 * refused in one line.  Never prints.
 */
#ifndef MLOOP_UBLK_DEVICE_H
#define MLOOP_UBLK_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "attach.h"
#include "device_state.h"

/* The files mloop-ublk writes in the device directory. */
#define MLOOP_DIR_UBLK_DEVICE "device"         /* "/dev/ublkbN" */

/* Whether this kernel makes ublk devices (/dev/ublk-control exists);
 * if not, ERR says why.
 */
bool mloop_ublk_available (char *err, size_t errlen);

/* Whether REQ asks for something only the NBD transport does; if so,
 * ERR names it.
 */
bool mloop_ublk_refuses (const struct mloop_attach_request *req,
                         char *err, size_t errlen);

/* Starts mloop-ublk on FILE in S's directory and records the device in
 * S (saved).  On failure nothing is left but the directory, which the
 * caller removes.
 */
int mloop_ublk_attach (const struct mloop_attach_request *req,
                       const char *file, struct mloop_device_state *s,
                       char *err, size_t errlen);

/* Stops mloop-ublk (which deletes the device), or deletes a device a
 * killed one left.  The caller holds the state lock and removes the
 * directory.
 */
int mloop_ublk_detach (const struct mloop_device_state *s,
                       char *err, size_t errlen);

/* Whether the kernel still has the device (/sys/block/ublkbN). */
bool mloop_ublk_device_present (int index);

#endif /* MLOOP_UBLK_DEVICE_H */
