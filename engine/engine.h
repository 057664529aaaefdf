/* mloop — the IO engine: a backing store served through kernel AIO.
 *
 * This is the interface both front ends stand on.  Lifecycle:
 *
 *   mloop_engine_open()   at configuration time: opens and probes the
 *                         backing store (no threads, no AIO contexts, so it
 *                         is safe before a daemonizing fork);
 *   mloop_engine_start()  in the process that will serve: starts the
 *                         AIO ring pool (the plugin's; see aio_pool.h);
 *   mloop_engine_submit() asynchronous IO, completions via io->complete;
 *   mloop_engine_stop(), mloop_engine_close().
 *
 * The library never prints and never exits: errors come back as negative
 * errnos, or as a one-line message in a caller-supplied buffer.
 */
#ifndef MLOOP_ENGINE_H
#define MLOOP_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backing.h"
#include "io.h"
#include "range_lock.h"
#include "aio_pool.h"

#define MLOOP_THREADS_DEFAULT      4
#define MLOOP_THREADS_MAX          64
#define MLOOP_QUEUE_DEPTH_DEFAULT  128
#define MLOOP_QUEUE_DEPTH_MAX      4096

/* The largest request the engine accepts (nbdkit's own limit is 64 MiB). */
#define MLOOP_MAX_REQUEST          (64u * 1024 * 1024)

struct mloop_engine_config {
  const char *path;
  unsigned threads;
  unsigned queue_depth;
  enum mloop_direct_mode direct;
  bool want_write;
};

struct mloop_engine {
  struct mloop_backing backing;
  unsigned threads;
  unsigned queue_depth;
  /* Kernel features, probed by mloop_engine_start(). */
  bool fua_in_aio;              /* RWF_DSYNC on AIO writes (Linux ≥ 4.13) */
  bool flush_in_aio;            /* IOCB_CMD_FDSYNC (Linux ≥ 4.18) */
  enum mloop_pool_mode mode;
  /* Serializes read-modify-write of partial blocks (unaligned.c). */
  struct mloop_range_lock rmw_lock;
  struct mloop_aio_pool *pool;
};

void mloop_engine_config_init (struct mloop_engine_config *cfg);

int mloop_engine_open (struct mloop_engine *e,
                       const struct mloop_engine_config *cfg,
                       char *err, size_t errlen);
/* Probes the kernel for RWF_DSYNC on AIO writes and AIO fdatasync
 * (sets fua_in_aio, flush_in_aio).  mloop_engine_start() does it; a
 * front end owning its AIO contexts calls it instead.
 */
void mloop_engine_probe_features (struct mloop_engine *e);

/* MODE: REAPER_THREADS for mloop_engine_submit() callers,
 * CALLER_REAPS when only the synchronous helpers are used (no handoff).
 */
int mloop_engine_start (struct mloop_engine *e, enum mloop_pool_mode mode,
                        char *err, size_t errlen);
void mloop_engine_stop (struct mloop_engine *e);
void mloop_engine_close (struct mloop_engine *e);

/* Submits IO (REAPER_THREADS mode only).  Returns 0 when accepted: io->complete will be called
 * exactly once, possibly before this returns (a zero-length request, or a
 * flush on a kernel without AIO fdatasync).  Returns a negative errno
 * when refused up front (out of range: EINVAL for reads, ENOSPC for
 * writes; EPERM writing a read-only store; EINVAL for a request too big),
 * in which case complete is never called and nothing was done.
 */
int mloop_engine_submit (struct mloop_engine *e, struct mloop_io *io);

/* For front ends that own their AIO contexts (an event loop):
 *
 * mloop_engine_prepare() validates IO and fills io->iocb.  Returns
 * MLOOP_PREPARED_AIO when the iocb must be submitted (to the caller's own
 * context), MLOOP_PREPARED_DONE when IO was completed already
 * (io->complete has run), MLOOP_PREPARED_BLOCKING when IO has no
 * asynchronous form (below), or a negative errno when IO was refused up
 * front (complete is not called).
 *
 * Blocking IO (a read-modify-write of an unaligned request, the
 * page-cache tail of an odd-sized file, fdatasync where AIO has none):
 * mloop_engine_perform_blocking() does it and returns 0 or a negative
 * errno, on any thread that may block (an event loop hands it to a
 * helper); mloop_engine_complete_blocking() then completes IO with that
 * result, on the thread that owns IO.
 *
 * mloop_engine_complete_event() handles the kernel's result RES for IO
 * (an io_event's res; its data field is IO).  Returns MLOOP_EVENT_DONE
 * once io->complete has run, or MLOOP_EVENT_RESUBMIT after a short
 * transfer, when io->iocb must be submitted again.
 */
enum {
  MLOOP_PREPARED_DONE = 0,
  MLOOP_PREPARED_AIO = 1,
  MLOOP_PREPARED_BLOCKING = 2,
};
int mloop_engine_prepare (struct mloop_engine *e, struct mloop_io *io);
int mloop_engine_perform_blocking (struct mloop_engine *e,
                                   struct mloop_io *io);
void mloop_engine_complete_blocking (struct mloop_engine *e,
                                     struct mloop_io *io, int result);
enum mloop_event_result mloop_engine_complete_event (struct mloop_engine *e,
                                                     struct mloop_io *io,
                                                     long res);

/* Like mloop_engine_submit(), then waits until io->complete has called
 * mloop_pool_waiter_done (WAITER); works in both modes.
 */
int mloop_engine_submit_and_wait (struct mloop_engine *e, struct mloop_io *io,
                                  struct mloop_pool_waiter *waiter);

/* Synchronous helpers for thread-per-request front ends.  Each returns 0
 * or a negative errno.
 */
int mloop_engine_pread (struct mloop_engine *e, void *buf, size_t count,
                        uint64_t offset);
int mloop_engine_pwrite (struct mloop_engine *e, const void *buf,
                         size_t count, uint64_t offset, unsigned flags);
int mloop_engine_flush (struct mloop_engine *e);

#endif /* MLOOP_ENGINE_H */
