/* mloop — the partitions of an attached /dev/nbdN (or /dev/ublkbN).
 *
 * The NBD client marks a device's partition table for reading whenever
 * its size is set (drivers/block/nbd.c, nbd_set_size), but the kernel
 * reads it only when the device is next opened.  Where udev runs, udev
 * opens it; where it does not (a container, an initramfs, the test VM),
 * nothing does and /dev/nbdNp1 never appears.  So mloop reads the table
 * itself after connecting and after a resize, like losetup -P.  The
 * number of partitions a device can have is fixed when the nbd module
 * loads (its max_part parameter; mloop.8 "Partitions").
 */
#ifndef MLOOP_PARTITIONS_H
#define MLOOP_PARTITIONS_H

#include <stdbool.h>
#include <stddef.h>

/* NAME is the kernel's name of the device: "nbd3", "ublkb0". */

/* Reads /dev/NAME's partition table now (BLKRRPART), creating
 * /dev/NAMEpN.  A device whose module was loaded with max_part=0
 * cannot have partitions: that is not an error.
 */
int mloop_partitions_scan (const char *name, char *err, size_t errlen);

/* Removes the partitions the kernel made for /dev/NAME (BLKPG), for
 * --no-partscan and before a detach.  Fails naming the first partition
 * still in use.
 */
int mloop_partitions_drop (const char *name, char *err, size_t errlen);

/* How many partitions /dev/NAME has now. */
unsigned mloop_partitions_count (const char *name);

#endif /* MLOOP_PARTITIONS_H */
