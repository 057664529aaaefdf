/* mloop — autoclear: a device that goes away when its last user closes it.
 *
 * As a loop device with LO_FLAGS_AUTOCLEAR (what `mount -o loop` sets),
 * an autoclear device is detached when its last opener closes it.  The
 * kernel does the disconnecting (NBD_CFLAG_DISCONNECT_ON_CLOSE); the
 * device's supervisor notices the device is gone and stops the server
 * and removes the device's directory, since no mloop command runs then.
 */
#ifndef MLOOP_AUTOCLEAR_H
#define MLOOP_AUTOCLEAR_H

#include <stdbool.h>
#include <stddef.h>

#include "device_state.h"

/* Marks the attached device S autoclear, in the kernel and in its state.
 * From then on the next last close detaches it, so call it once the
 * device is in use or about to be (attach's own opens are over).
 */
int mloop_autoclear_enable (struct mloop_device_state *s, char *err,
                            size_t errlen);

/* Whether the kernel has let go of S's device: not connected, or
 * connected to another image (a later attach may reuse the index).
 */
bool mloop_autoclear_released (const struct mloop_device_state *s);

/* Gives S's node back to root (device_owner.h) once the kernel has let
 * S's device go, unless another image is connected there by then (its
 * own attach decides that node's owner).  For a device attached for a
 * user, whose node would otherwise stay theirs: no detach ran.
 */
void mloop_autoclear_give_back (const struct mloop_device_state *s);

#endif /* MLOOP_AUTOCLEAR_H */
