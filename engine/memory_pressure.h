/* mloop — keeping a local NBD server out of the memory-reclaim deadlock.
 *
 * When /dev/nbdN's own pages are being written back to free memory, the
 * server must not itself wait on reclaim (allocating, faulting in a page)
 * or it waits on the writeback it is supposed to perform.  The kernel
 * offers two defences, and mloop uses both where it may:
 *
 *  - PR_SET_IO_FLUSHER (Linux 5.6, needs CAP_SYS_RESOURCE): allocations
 *    by the calling thread do no IO to reclaim, and the thread is not
 *    throttled by dirty-page limits.  Per thread, so every thread that
 *    handles requests calls mloop_io_flusher_thread() once.
 *  - mlockall(MCL_CURRENT | MCL_FUTURE), an option (--mlock, mlock=on):
 *    the server's memory is never paged out, so serving never faults on
 *    swap.  It costs pinned memory, hence optional.
 */
#ifndef MLOOP_MEMORY_PRESSURE_H
#define MLOOP_MEMORY_PRESSURE_H

#include <stdbool.h>

/* Marks the calling thread an IO flusher, once per thread.  Returns
 * whether it is one (false where not permitted or not supported; serving
 * still works, only without this protection).
 */
bool mloop_io_flusher_thread (void);

/* mlockall(MCL_CURRENT | MCL_FUTURE).  0, or -errno. */
int mloop_lock_memory (void);

#endif /* MLOOP_MEMORY_PRESSURE_H */
