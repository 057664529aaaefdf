/* mloop — the IO engine: a backing store served through kernel AIO.
 *
 * This is the interface every front end stands on.  The engine decides
 * how each request reaches the disk (AIO on the O_DIRECT descriptor, a
 * bounce buffer, a read-modify-write, the page-cache tail) and completes
 * it; it owns no AIO context and no thread.  Who submits and reaps is the
 * front end's choice: mloop-server's event loops own one AIO context
 * each; the nbdkit plugin's threads submit to a pool of them (pooled.h).
 *
 *   mloop_engine_open()   at configuration time: opens and probes the
 *                         backing store (no threads, no AIO contexts, so it
 *                         is safe before a daemonizing fork);
 *   mloop_engine_probe_features()  in the process that will serve;
 *   mloop_engine_prepare() ... mloop_engine_complete_event()  per request;
 *   mloop_engine_close().
 *
 * Errors, for the whole engine library (this folder): functions return
 * 0 (or a count) on success and a negative errno on failure; those that
 * can fail for a reason worth a sentence (opening, starting) also write a
 * one-line message into a caller-supplied buffer; only the allocator,
 * returning a pointer, says NULL with errno set.  The library never
 * prints and never exits.
 */
#ifndef MLOOP_ENGINE_H
#define MLOOP_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backing.h"
#include "io.h"
#include "overlay.h"
#include "range_lock.h"

/* The largest request the engine accepts (nbdkit's own limit is 64 MiB). */
#define MLOOP_MAX_REQUEST          (64u * 1024 * 1024)

struct mloop_engine_config {
  const char *path;
  enum mloop_direct_mode direct;
  bool want_write;
  struct mloop_window window;   /* all zero: the whole file */
  /* A copy-on-write overlay (overlay.h) to write to, made when there is
   * no file at this path; the store at 'path' is then only read.  NULL:
   * none.
   */
  const char *overlay;
};

struct mloop_engine {
  /* The store served: with an overlay, the read-only base, though
   * backing.writable then says whether the device takes writes (they go
   * to the overlay) and backing.logical_block_size is at least the
   * overlay's cluster, the alignment of its fast path.
   */
  struct mloop_backing backing;
  struct mloop_overlay *overlay;        /* NULL: none */
  /* Kernel features, probed by mloop_engine_probe_features(). */
  bool fua_in_aio;              /* RWF_DSYNC on AIO writes (Linux ≥ 4.13) */
  bool flush_in_aio;            /* IOCB_CMD_FDSYNC (Linux ≥ 4.18) */
  /* Serializes read-modify-write of partial blocks (unaligned.c). */
  struct mloop_range_lock rmw_lock;
};

void mloop_engine_config_init (struct mloop_engine_config *cfg);

int mloop_engine_open (struct mloop_engine *e,
                       const struct mloop_engine_config *cfg,
                       char *err, size_t errlen);
/* Probes the kernel for RWF_DSYNC on AIO writes and AIO fdatasync
 * (sets fua_in_aio, flush_in_aio), with AIO of its own: call it in the
 * process that will serve, before the first request.
 */
void mloop_engine_probe_features (struct mloop_engine *e);

void mloop_engine_close (struct mloop_engine *e);

/* Makes every completed write durable, on the calling thread: for
 * callers whose writes have all completed (pooled.h's flush) and for
 * blocking flushes.  0 or a negative errno.
 */
int mloop_engine_flush (struct mloop_engine *e);

/* Reads the size of the store again (mloop_backing_reprobe_size).  An
 * overlay's device keeps the size the overlay was made with: -ENOTSUP,
 * with the reason in ERR.
 */
int mloop_engine_reprobe_size (struct mloop_engine *e, char *err,
                               size_t errlen);

/* The path of one request:
 *
 * mloop_engine_prepare() validates IO and fills io->iocb.  Returns
 * MLOOP_PREPARED_AIO when the iocb must be submitted (to the caller's own
 * context), MLOOP_PREPARED_DONE when IO was completed already
 * (io->complete has run), MLOOP_PREPARED_BLOCKING when IO has no
 * asynchronous form (below), or a negative errno when IO was refused up
 * front (complete is not called): out of range (EINVAL for reads, ENOSPC
 * for writes), EPERM writing a read-only store, EINVAL for a request
 * over MLOOP_MAX_REQUEST.
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
 *
 * mloop_engine_perform_event() does what the kernel would do with the
 * iocb of IO prepared for AIO, synchronously on the calling thread (one
 * that may block), and returns that RES: for a front end with no room
 * in an AIO context (fs.aio-max-nr reached), whose result then goes to
 * mloop_engine_complete_event() as if reaped.
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
long mloop_engine_perform_event (struct mloop_engine *e, struct mloop_io *io);
/* Gives back what mloop_engine_prepare() took for IO (a bounce buffer)
 * when IO prepared for AIO could not be submitted; complete is not called.
 */
void mloop_engine_abandon (struct mloop_engine *e, struct mloop_io *io);
enum mloop_event_result mloop_engine_complete_event (struct mloop_engine *e,
                                                     struct mloop_io *io,
                                                     long res);

#endif /* MLOOP_ENGINE_H */
