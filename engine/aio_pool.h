/* mloop — the nbdkit plugin's pool of kernel AIO contexts ("rings").
 *
 * N rings, each one kernel AIO context.  Submitters (any thread) call
 * io_submit directly on a ring — there is no queue and no handoff on the
 * way in.  Who reaps a ring's completions depends on the mode below;
 * for each completion the pool calls its event handler, which either
 * finishes the request or asks for it to be resubmitted (a short
 * transfer).  A per-ring semaphore bounds the requests in flight to the
 * queue depth, so io_submit never meets a full ring.
 *
 * (mloop-server does not use this pool: each of its event loops owns one
 * ring and reaps it itself.)
 */
#ifndef MLOOP_AIO_POOL_H
#define MLOOP_AIO_POOL_H

#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "io.h"

struct mloop_aio_pool;

/* Handles the completion of IO with the kernel's result RES (bytes or a
 * negative errno).  Runs on whichever thread reaps.
 */
typedef enum mloop_event_result (*mloop_pool_event_fn) (void *opaque,
                                                         struct mloop_io *io,
                                                         long res);

/* How completions are reaped.
 *
 * REAPER_THREADS: each ring has a thread sleeping in io_getevents; any
 * thread may submit with a completion callback and go on (the
 * asynchronous interface).  Costs one wake-up of that thread per batch
 * plus one wake-up of whoever waits for the result.
 *
 * CALLER_REAPS (leader/follower): no threads of the pool's own.  A thread
 * that submits and then waits becomes the reaper of its ring if
 * nobody is; otherwise it sleeps until the reaper completes its request
 * or hands it the reaper role.  Every request then costs its thread one
 * sleep, exactly like a synchronous pread: measured 2.09 → ~1.4 context
 * switches per 4k read under nbdkit (docs/design.md).  Only
 * mloop_aio_pool_submit_and_wait() may be used in this mode.
 */
enum mloop_pool_mode {
  MLOOP_POOL_CALLER_REAPS,
  MLOOP_POOL_REAPER_THREADS,
};

/* A thread waiting for one request in CALLER_REAPS mode.  The request's
 * completion callback must call mloop_pool_waiter_done().
 */
struct mloop_pool_waiter {
  sem_t wake;
  atomic_bool done;
  bool queued;                          /* on the ring's follower list */
  struct mloop_pool_waiter *next;
};

void mloop_pool_waiter_init (struct mloop_pool_waiter *w);
void mloop_pool_waiter_done (struct mloop_pool_waiter *w);
/* Sleeps until W is done: for a request completed off the rings. */
void mloop_pool_waiter_wait (struct mloop_pool_waiter *w);
void mloop_pool_waiter_destroy (struct mloop_pool_waiter *w);

/* Starts RINGS rings with QUEUE_DEPTH requests in flight each.  Short
 * of fs.aio-max-nr, smaller rings (down to MLOOP_AIO_RING_FLOOR), then
 * fewer (at least one).
 * Returns NULL with errno set on failure (nothing left running).
 */
struct mloop_aio_pool *mloop_aio_pool_start (enum mloop_pool_mode mode,
                                                   unsigned threads,
                                                   unsigned queue_depth,
                                                   mloop_pool_event_fn on_event,
                                                   void *opaque);

/* Submits IO (its iocb already prepared) to one of the rings, waiting
 * for a free slot if every ring is at its queue depth.  Returns 0, or a
 * negative errno if the kernel refused it (the event handler is then not
 * called).
 */
int mloop_aio_pool_submit (struct mloop_aio_pool *pool,
                              struct mloop_io *io);

/* Submits IO and returns once WAITER has been marked done (by IO's
 * completion callback), reaping its ring meanwhile if no other
 * thread is.  Returns 0, or a negative errno if the kernel refused IO.
 */
int mloop_aio_pool_submit_and_wait (struct mloop_aio_pool *pool,
                                       struct mloop_io *io,
                                       struct mloop_pool_waiter *waiter);

/* Whether the system-wide AIO limit (fs.aio-max-nr) made some ring
 * smaller, or the pool have fewer rings, than asked for.
 */
bool mloop_aio_pool_limited (const struct mloop_aio_pool *pool);

/* Waits for in-flight requests to finish, stops and joins every reaper,
 * and frees the pool.  No submissions may race with this.
 */
void mloop_aio_pool_stop (struct mloop_aio_pool *pool);

#endif /* MLOOP_AIO_POOL_H */
