/* mloop — changing the size of an attached device while it runs
 * (`mloop resize`, like `losetup -c`).
 *
 * Both the kernel and the server must learn the new size, in an order
 * that never lets the kernel send a request the server would refuse:
 * growing, the server first, then the kernel; shrinking, the kernel
 * first, then the server.  The kernel takes the size live
 * (nbd_netlink.h, mloop_nbd_netlink_set_size).  mloop-server re-reads
 * its image's size on SIGHUP; nbdkit cannot change the size of a
 * negotiated connection, so its supervisor restarts it (supervisor.c,
 * SIGUSR1) and the kernel is handed new connections.  Either way the
 * resize waits until a fresh handshake on the device's socket announces
 * the new size.  Never prints.
 *
 * The image is reached through the engine (engine.h), so a file and a
 * Ceph RBD image resize alike: a file is truncated or extended, an RBD
 * image resized through librbd (its server, which holds the image's
 * exclusive lock, performs it for us).
 */
#ifndef MLOOP_RESIZE_H
#define MLOOP_RESIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "device_state.h"

/* Resizes the device in S (as mloop_lookup found it) to NEW_SIZE when
 * HAVE_SIZE: the image is grown (or, when nothing is stored past
 * NEW_SIZE, cut short) to it first.  Without HAVE_SIZE the device takes
 * the image's current size.  Refuses remote devices, --size on a block
 * device, a size that is not a multiple of the device's block size,
 * shrinking a mounted device, shrinking below a partition or below data
 * in the file (ERR names the first byte in use).  On success S->size is
 * the new size, also in the device's state file.
 */
int mloop_resize (struct mloop_device_state *s, bool have_size,
                  uint64_t new_size, char *err, size_t errlen);

/* Replaces the device's nbdkit with a new one, whose connections all
 * negotiate the image's size now: FN (DATA, ...) 0, or -1 with ERR.
 */
struct mloop_restart {
  int (*fn) (void *data, char *err, size_t errlen);
  void *data;
};

/* For the supervisor of the device in DIR: when its server announces a
 * size other than the device's (an RBD image resized elsewhere, which
 * the server learns through librbd's update watch), gives the kernel
 * that size, with mloop_resize's refusals (a shrink under a mount or a
 * partition); RESTART does an nbdkit's part.  Never waits for the
 * device's lock.  Returns 1 when the device was resized (*OLD_SIZE and
 * *NEW_SIZE say from what to what), 0 when there was nothing to do or
 * no way to look now, -1 with ERR.
 */
int mloop_resize_follow (const char *dir,
                         const struct mloop_restart *restart,
                         uint64_t *old_size, uint64_t *new_size,
                         char *err, size_t errlen);

/* The first byte at or past FROM that E's image stores, in *FIRST (the
 * image's size when there is none): asks for extents until data or the
 * end, since a reply may cover only a prefix of what was asked.  0, or
 * a negative errno (EIO: a reply covered nothing).
 */
struct mloop_engine;
int mloop_first_data_past (struct mloop_engine *e, uint64_t from,
                           uint64_t *first);

/* Opens /dev/nbdINDEX read-only and closes it again.  A resize marks the
 * disk for a partition scan on its next open (Linux: nbd_set_size sets
 * GD_NEED_PART_SCAN when max_part > 0); this is that open, so the
 * partitions are re-read now.
 */
int mloop_device_open_for_partition_scan (int index, char *err,
                                          size_t errlen);

#endif /* MLOOP_RESIZE_H */
