/* mloop — the engine for thread-per-request front ends (the nbdkit plugin).
 *
 * The calling threads submit straight into a pool of AIO rings
 * (aio_pool.h) and wait for their own request; IO with no asynchronous
 * form runs on the calling thread, which may block.  An event-driven
 * front end does not use this: it owns its AIO contexts and drives the
 * engine with mloop_engine_prepare() and friends (engine.h).
 *
 * Errors: 0 or a negative errno; mloop_pooled_check() and
 * mloop_pooled_start() also write a one-line message.
 */
#ifndef MLOOP_POOLED_H
#define MLOOP_POOLED_H

#include <stddef.h>
#include <stdint.h>

#include "aio_pool.h"
#include "aio_ring.h"             /* MLOOP_QUEUE_DEPTH_* */
#include "engine.h"

/* Rings in the pool (the plugin's threads=). */
#define MLOOP_RINGS_DEFAULT 4
#define MLOOP_RINGS_MAX     64

struct mloop_pooled {
  /* Where a store with threads of its own (RBD) completes requests: on
   * its thread, at once (the callers wait on their own requests).
   */
  struct mloop_port port;
  struct mloop_engine *engine;
  struct mloop_aio_pool *pool;
  unsigned rings;
  unsigned queue_depth;         /* requests in flight per ring */
  enum mloop_pool_mode mode;
};

/* Whether RINGS and QUEUE_DEPTH are within bounds; at configuration time. */
int mloop_pooled_check (unsigned rings, unsigned queue_depth,
                        char *err, size_t errlen);

/* Probes the kernel (mloop_engine_probe_features) and starts the pool
 * over the open engine E.  MODE: CALLER_REAPS when only the synchronous
 * helpers below are used (no handoff), REAPER_THREADS for
 * mloop_pooled_submit() callers.
 */
int mloop_pooled_start (struct mloop_pooled *p, struct mloop_engine *e,
                        unsigned rings, unsigned queue_depth,
                        enum mloop_pool_mode mode, char *err, size_t errlen);
/* Waits for requests in flight and stops the pool (the engine stays open). */
void mloop_pooled_stop (struct mloop_pooled *p);

/* Submits IO (REAPER_THREADS mode only).  Returns 0 when accepted:
 * io->complete will be called exactly once, possibly before this returns
 * (a zero-length request, blocking IO done on this thread).  A negative
 * errno when refused up front (see mloop_engine_prepare) or by the
 * kernel: complete is then never called and nothing was done.
 */
int mloop_pooled_submit (struct mloop_pooled *p, struct mloop_io *io);

/* Like mloop_pooled_submit(), then waits until io->complete has called
 * mloop_pool_waiter_done (WAITER); works in both modes.
 */
int mloop_pooled_submit_and_wait (struct mloop_pooled *p, struct mloop_io *io,
                                  struct mloop_pool_waiter *waiter);

/* Synchronous IO on the calling thread's behalf: 0 or a negative errno. */
int mloop_pooled_pread (struct mloop_pooled *p, void *buf, size_t count,
                        uint64_t offset);
int mloop_pooled_pwrite (struct mloop_pooled *p, const void *buf,
                         size_t count, uint64_t offset, unsigned flags);
int mloop_pooled_flush (struct mloop_pooled *p);

#endif /* MLOOP_POOLED_H */
