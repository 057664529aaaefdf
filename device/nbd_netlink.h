/* mloop — the kernel NBD client's generic-netlink interface.
 *
 * The kernel takes already-negotiated sockets (NBD_CMD_CONNECT) and from
 * then on speaks only the transmission phase over them.  One call per
 * netlink command; each opens its own netlink socket, so callers need no
 * setup.  Needs CAP_SYS_ADMIN.  Never prints; errors come back as one
 * line in ERR, and the return value is -errno so callers can tell EBUSY
 * (device in use) from ENOENT (no NBD support) and the rest.
 */
#ifndef MLOOP_NBD_NETLINK_H
#define MLOOP_NBD_NETLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct mloop_nbd_device_config {
  int index;                    /* /dev/nbdINDEX, or -1: the kernel picks */
  uint64_t size;                /* bytes */
  uint64_t block_size;          /* logical block size, 512..4096 */
  uint64_t server_flags;        /* transmission flags from the handshake */
  uint64_t timeout;             /* seconds before a request is retried */
  uint64_t dead_conn_timeout;   /* seconds IO waits for a reconnect */
  const char *backend;          /* shown in /sys/block/nbdN/backend */
  const int *fds;               /* negotiated sockets */
  size_t nr_fds;
};

/* Checks that the kernel has the "nbd" generic-netlink family, loading
 * the nbd module if it is not there yet (unless
 * mloop_nbd_netlink_load_early was called).  0, or -ENOENT with a
 * message that names the fix.
 */
int mloop_nbd_netlink_available (char *err, size_t errlen);

/* Loads the nbd module now if the kernel lacks the "nbd" family, and
 * makes mloop_nbd_netlink_available only look from then on, never run
 * modprobe: for a process that will hold descriptors no child of it
 * may be given (mloop-dbus holds its callers', which a child closes at
 * its exec and may wait on for as long as their owner likes), called
 * before it holds any and before it has threads.
 */
void mloop_nbd_netlink_load_early (void);

/* Hands the sockets to the kernel.  On success returns 0 and the device
 * index in *INDEX; the kernel holds its own references to the sockets,
 * so the caller closes its descriptors either way.
 */
int mloop_nbd_netlink_connect (const struct mloop_nbd_device_config *c,
                               int *index, char *err, size_t errlen);

/* Whether /dev/nbdINDEX is connected with BACKEND, as SYS_BLOCK
 * ("/sys/block", or a test's copy) shows it: 0, or -ESTALE with ERR
 * naming the device and what is there instead (another backend, or
 * none: not connected, or another tool's device, which named none).
 */
int mloop_nbd_backend_check_at (const char *sys_block, int index,
                                const char *backend, char *err,
                                size_t errlen);

/* Replaces the dead connections of a configured device with FDS.
 * BACKEND must repeat the identifier the device was connected with: the
 * kernel refuses a reconfigure without it ("must specify backend").
 * The kernel compares it only when the device has one, so every
 * reconfigure here (this one, resize, autoclear, a dead connection's
 * replacement) is refused first unless the device shows BACKEND
 * (mloop_nbd_backend_check_at): a device another tool connected at a
 * departed mloop device's index, naming none, is never given its
 * sockets or changed.
 */
int mloop_nbd_netlink_reconfigure (int index, const char *backend,
                                   const int *fds, size_t nr_fds,
                                   uint64_t dead_conn_timeout,
                                   char *err, size_t errlen);

/* Changes the size of a connected device to SIZE bytes while it runs
 * (NBD_CMD_RECONFIGURE with NBD_ATTR_SIZE_BYTES; Linux 6.1:
 * nbd_genl_reconfigure → nbd_genl_size_set → nbd_set_size).  The kernel
 * sets the new capacity at once and tells udev (KOBJ_CHANGE); requests
 * already queued are not drained, so the server must serve the larger of
 * the old and new size meanwhile.  It also marks the disk for a partition
 * scan on its next open (max_part > 0).  BACKEND as for reconfigure.  The
 * ioctl (NBD_SET_SIZE) would not do: the kernel refuses ioctls on a
 * device connected over netlink.
 */
int mloop_nbd_netlink_set_size (int index, const char *backend,
                                uint64_t size, char *err, size_t errlen);

/* Offers the negotiated socket FD for one dead connection of a device
 * (a reconfigure with that socket alone).  The kernel puts it into the
 * first slot it has marked dead (drivers/block/nbd.c,
 * nbd_reconnect_socket); when it has none it drops the socket and still
 * answers success, so its answer cannot tell.  What does: the kernel sets
 * the send timeout of a socket it takes to the device's request timeout,
 * and FD's is cleared here first.  Returns 1 if the kernel took FD, 0 if
 * it had no dead slot, or -errno.  (A device without a request timeout
 * would always look full; mloop sets one on every device.)  The caller
 * still closes FD.
 */
int mloop_nbd_netlink_replace_dead (int index, const char *backend, int fd,
                                    uint64_t dead_conn_timeout,
                                    char *err, size_t errlen);

/* Makes the kernel disconnect /dev/nbdINDEX when its last opener closes
 * it (NBD_CFLAG_DISCONNECT_ON_CLOSE): mloop's autoclear.  Set once the
 * device is ready, since attach's own opens (reading the partition
 * table) would otherwise end it.  BACKEND as for reconfigure.
 */
int mloop_nbd_netlink_disconnect_on_close (int index, const char *backend,
                                           char *err, size_t errlen);

/* Tells the server goodbye on every connection and tears the device down. */
int mloop_nbd_netlink_disconnect (int index, char *err, size_t errlen);

/* Whether /dev/nbdINDEX currently has a configuration (is "connected"). */
int mloop_nbd_netlink_connected (int index, bool *connected,
                                 char *err, size_t errlen);

#endif /* MLOOP_NBD_NETLINK_H */
