/* mloop — is the kernel reading the replies of every connection?
 *
 * The kernel NBD client reads each connection's replies in a work item
 * (recv_work) on the device's "nbdN-recv" workqueue, for as long as the
 * connection lives.  On Linux 6.1, when the worker pool is slow to create
 * a kworker, the workqueue's rescuer takes every pending receive work and
 * runs only the first (which never returns): the other connections' replies
 * are then never read, and each request sent on them waits for the device's
 * request timeout (docs/design.md, "A request held for the whole timeout").
 * Userspace can see it: a kworker running a work item names it in
 * /proc/PID/comm ("kworker/u9:0+nbd0-recv"), and so does the rescuer.
 */
#ifndef MLOOP_NBD_RECEIVERS_H
#define MLOOP_NBD_RECEIVERS_H

#include <stdbool.h>

/* How many of /dev/nbdINDEX's receive works are running now. */
unsigned mloop_nbd_receivers (int index);

/* Waits for /dev/nbdINDEX to have N receive works running, giving up
 * when the count has not changed for SETTLE_MS (kworkers are not coming:
 * the rescuer holds the rest) or after TIMEOUT_MS.  True if all N run;
 * also true if none is seen at all (a kernel that does not name work
 * items in comm: nothing can be told), so only "some but not all" is
 * reported as starved.
 */
bool mloop_nbd_receivers_all_running (int index, unsigned n,
                                      unsigned settle_ms,
                                      unsigned timeout_ms);

/* Waits up to TIMEOUT_MS for every receive work of INDEX to end. */
void mloop_nbd_receivers_wait_gone (int index, unsigned timeout_ms);

#endif /* MLOOP_NBD_RECEIVERS_H */
