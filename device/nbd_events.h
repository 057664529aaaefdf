/* mloop — the kernel NBD client's announcements of dead connections.
 *
 * When the kernel gives up on one connection of a device while the device
 * stays configured (a request outlived the request timeout, or a send or
 * receive on it failed), it shuts that socket down, marks its slot dead
 * and tells userspace: a generic-netlink NBD_CMD_LINK_DEAD carrying the
 * device's NBD_ATTR_INDEX, multicast on the "nbd" family's group
 * (NBD_GENL_MCAST_GROUP_NAME; drivers/block/nbd.c, nbd_mark_nsock_dead
 * and nbd_dead_link_work).  The message names the device, not the
 * connection.  A slot marked dead stays dead until a reconfigure hands
 * the kernel a new socket (nbd_netlink.h).
 *
 * Never prints; errors are one line in ERR.
 */
#ifndef MLOOP_NBD_EVENTS_H
#define MLOOP_NBD_EVENTS_H

#include <stdbool.h>
#include <stddef.h>

struct mloop_nbd_events;

/* Subscribes a new netlink socket to the group; NULL with ERR. */
struct mloop_nbd_events *mloop_nbd_events_open (char *err, size_t errlen);

/* The descriptor to poll: readable when announcements have arrived. */
int mloop_nbd_events_fd (const struct mloop_nbd_events *ev);

/* Reads every announcement that has arrived, without blocking, calling
 * DEAD (INDEX, DATA) for each, INDEX the device it named.  Sets *LOST
 * when the socket's buffer overflowed, so some were lost.  0, or -1 with
 * ERR.
 */
int mloop_nbd_events_read (struct mloop_nbd_events *ev,
                           void (*dead) (int index, void *data), void *data,
                           bool *lost, char *err, size_t errlen);

void mloop_nbd_events_close (struct mloop_nbd_events *ev);

#endif /* MLOOP_NBD_EVENTS_H */
