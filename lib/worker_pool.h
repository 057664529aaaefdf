/* mloop — the AIO worker pool.
 *
 * Thread model: N workers, each owning one kernel AIO context and one
 * thread.  Submitters (any thread) call io_submit directly on a worker's
 * context — there is no queue and no handoff on the way in.  The worker
 * thread only reaps: it sleeps in io_getevents, and for each completion
 * calls the pool's event handler, which either finishes the request or
 * asks for it to be resubmitted (a short transfer).  A per-worker
 * semaphore bounds the requests in flight to the queue depth, so
 * io_submit never meets a full ring.
 */
#ifndef MLOOP_WORKER_POOL_H
#define MLOOP_WORKER_POOL_H

#include "io.h"

struct mloop_worker_pool;

enum mloop_event_result {
  MLOOP_EVENT_DONE,             /* request completed; slot is free */
  MLOOP_EVENT_RESUBMIT,         /* iocb re-prepared; submit it again */
};

/* Handles the completion of IO with the kernel's result RES (bytes or a
 * negative errno).  Runs on a worker thread.
 */
typedef enum mloop_event_result (*mloop_pool_event_fn) (void *opaque,
                                                         struct mloop_io *io,
                                                         long res);

/* Starts THREADS workers with QUEUE_DEPTH requests in flight each.
 * Returns NULL with errno set on failure (nothing left running).
 */
struct mloop_worker_pool *mloop_worker_pool_start (unsigned threads,
                                                   unsigned queue_depth,
                                                   mloop_pool_event_fn on_event,
                                                   void *opaque);

/* Submits IO (its iocb already prepared) to one of the workers, waiting
 * for a free slot if every worker is at its queue depth.  Returns 0, or a
 * negative errno if the kernel refused it (the event handler is then not
 * called).
 */
int mloop_worker_pool_submit (struct mloop_worker_pool *pool,
                              struct mloop_io *io);

/* Waits for in-flight requests to finish, stops and joins every worker,
 * and frees the pool.  No submissions may race with this.
 */
void mloop_worker_pool_stop (struct mloop_worker_pool *pool);

unsigned mloop_worker_pool_size (const struct mloop_worker_pool *pool);

#endif /* MLOOP_WORKER_POOL_H */
