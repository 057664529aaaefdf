/* mloop — what /sys/block shows of an NBD device, read one way.
 *
 * The kernel shows /sys/block/nbdN/backend while the device has a
 * configuration connected with a backend identifier (every mloop
 * connect names one: its image), and "pid" while the device is started
 * (a connect gave it its sockets).  An ioctl connect (qemu-nbd -c,
 * nbd-client -L) shows no backend; a netlink connect that named none
 * shows an empty one.  Who is at an index decides what a stale state,
 * an autoclear supervisor or a reconfigure may touch there.
 */
#ifndef MLOOP_NBD_SYSFS_H
#define MLOOP_NBD_SYSFS_H

#include <stdbool.h>

/* The backend /dev/nbdINDEX's configuration names, as SYS_BLOCK
 * ("/sys/block", or a test's copy) shows it, without its newline
 * (g_free it): "" when the configuration named none, NULL when none is
 * shown (no configuration, or an ioctl connect's).
 */
char *mloop_nbd_sysfs_backend (const char *sys_block, int index);

/* Whether /dev/nbdINDEX is started: a connect gave it its sockets, as
 * opposed to a configuration a descriptor open on the idle device made.
 */
bool mloop_nbd_sysfs_started (int index);

#endif /* MLOOP_NBD_SYSFS_H */
