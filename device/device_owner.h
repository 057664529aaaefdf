/* mloop — a device attached for a user who is not root (mloop's D-Bus
 * service) belongs to that user: its node and its partitions' nodes are
 * theirs (mode 0600) while it is attached, so they can read and write it
 * as they could the image.  Every other device node is root's and the
 * disk group's (0660, as udev makes them).  A node goes back to them
 * before its device is disconnected by a detach, when the kernel lets an
 * autoclear device go (autoclear.h), and, for any node a device left
 * behind (an attach or supervisor that died), before mloop gives the
 * kernel the next image there: a descriptor a user holds open on an idle
 * device keeps a netlink connect (every mloop attach's) from taking it,
 * and, the node being root's by then, they cannot open it once the next
 * image is there.  An ioctl connect (qemu-nbd -c, nbd-client -L) takes
 * a device held open all the same: a user who reopened their autoclear
 * device before its supervisor looked keeps that descriptor on whatever
 * such a tool of root's connects there (docs/design.md says so).
 */
#ifndef MLOOP_DEVICE_OWNER_H
#define MLOOP_DEVICE_OWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <glib.h>

/* Gives device NAME ("nbdN") and its partitions to OWNER, or, for owner
 * 0, back to root and the disk group, without the access ACL any owner
 * before may have set on a node.  -1 with ERR on failure.
 */
int mloop_device_owner_set (const char *name, uid_t owner, char *err,
                            size_t errlen);

/* Whether /dev/NAME can be opened by root and the disk group only (its
 * mode says so and it has no access ACL): what a node must be when the
 * kernel connects an image to it.
 */
bool mloop_device_owner_is_root (const char *name);

/* Gives back to root every idle nbd device's node (and partitions') that
 * is not root's, then returns the lowest index from FROM on of an idle
 * device whose node is root's, or -1 when there is none.  Idle: the
 * kernel says it is not connected (it may still be busy: held open, or
 * being connected by another attach, which the connect then refuses).
 */
int mloop_device_owner_reclaim_idle (int from);

/* Gives back to root every idle nbd device's node that is not root's,
 * as mloop_device_owner_reclaim_idle does, then returns the indexes
 * from FROM on of the devices whose node is root's, lowest first
 * (g_array_unref it), idle or not: asked after a claim of one
 * (mloop_device_owner_idle), so that attaches at once each ask about
 * one device, not about every device another has claimed.
 */
GArray *mloop_device_owner_candidates (int from);

/* Whether nbd device INDEX is idle: the kernel says it is not
 * connected (held open or being connected, it may still be busy).
 */
bool mloop_device_owner_idle (int index);

#endif /* MLOOP_DEVICE_OWNER_H */
