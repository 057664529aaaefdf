/* mloop — a device attached for a user who is not root (mloop's D-Bus
 * service) belongs to that user: its node and its partitions' nodes are
 * theirs (mode 0600) while it is attached, so they can read and write it
 * as they could the image.  Every other device node is root's and the
 * disk group's (0660, as udev makes them), and a node goes back to them
 * before its device is disconnected, so the next image attached there is
 * not the last owner's.
 */
#ifndef MLOOP_DEVICE_OWNER_H
#define MLOOP_DEVICE_OWNER_H

#include <stddef.h>
#include <sys/types.h>

/* Gives device NAME ("nbdN") and its partitions to OWNER, or, for owner
 * 0, back to root and the disk group.  -1 with ERR on failure.
 */
int mloop_device_owner_set (const char *name, uid_t owner, char *err,
                            size_t errlen);

#endif /* MLOOP_DEVICE_OWNER_H */
