/* mloop — the engine for thread-per-request front ends.  See pooled.h.
 *
 * The calling thread submits with io_submit itself and then waits: in
 * CALLER_REAPS mode by reaping the ring itself when no other thread is
 * (see aio_pool.h), so a request costs one sleep and no handoff.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "aio_ring.h"
#include "align.h"
#include "pooled.h"

int
mloop_pooled_check (unsigned rings, unsigned queue_depth,
                    char *err, size_t errlen)
{
  if (rings < 1 || rings > MLOOP_RINGS_MAX) {
    snprintf (err, errlen, "threads=%u: must be between 1 and %d",
              rings, MLOOP_RINGS_MAX);
    return -EINVAL;
  }
  if (queue_depth < 1 || queue_depth > MLOOP_QUEUE_DEPTH_MAX) {
    snprintf (err, errlen, "queue-depth=%u: must be between 1 and %d",
              queue_depth, MLOOP_QUEUE_DEPTH_MAX);
    return -EINVAL;
  }
  return 0;
}

static enum mloop_event_result
on_event (void *opaque, struct mloop_io *io, long res)
{
  return mloop_engine_complete_event (opaque, io, res);
}

/* A store's completion, on its thread: completes IO there (io->complete
 * only wakes the waiting caller or hands the reply to nbdkit).
 */
static void
post_at_once (struct mloop_port *port, struct mloop_io *io, long res)
{
  struct mloop_pooled *p = (struct mloop_pooled *) port;

  mloop_engine_complete_event (p->engine, io, res);
}

int
mloop_pooled_start (struct mloop_pooled *p, struct mloop_engine *e,
                    unsigned rings, unsigned queue_depth,
                    enum mloop_pool_mode mode, char *err, size_t errlen)
{
  int r = mloop_pooled_check (rings, queue_depth, err, errlen);

  if (r < 0)
    return r;
  memset (p, 0, sizeof *p);
  p->port.post = post_at_once;
  mloop_engine_probe_features (e);
  p->engine = e;
  p->rings = rings;
  p->queue_depth = queue_depth;
  p->mode = mode;
  p->pool = mloop_aio_pool_start (mode, rings, queue_depth, on_event, e);
  if (p->pool == NULL) {
    r = -errno;
    if (r == -EAGAIN)
      mloop_aio_limit_message (err, errlen, MLOOP_AIO_RING_FLOOR);
    else
      snprintf (err, errlen, "starting %u AIO rings (queue-depth=%u): %s",
                rings, queue_depth, strerror (errno));
    return r;
  }
  return 0;
}

void
mloop_pooled_stop (struct mloop_pooled *p)
{
  mloop_aio_pool_stop (p->pool);
  p->pool = NULL;
}

/* Runs what mloop_engine_prepare() decided: blocking IO on the calling
 * thread (these callers may block), AIO through the pool.
 */
static int
submit_prepared (struct mloop_pooled *p, struct mloop_io *io, int prepared,
                 struct mloop_pool_waiter *waiter)
{
  struct mloop_engine *e = p->engine;
  int r;

  if (prepared == MLOOP_PREPARED_BLOCKING) {
    mloop_engine_complete_blocking (e, io,
                                    mloop_engine_perform_blocking (e, io));
    return 0;
  }
  if (prepared == MLOOP_PREPARED_QUEUED) {
    if (waiter)
      mloop_pool_waiter_wait (waiter);
    return 0;
  }
  if (prepared != MLOOP_PREPARED_AIO)
    return prepared;            /* done already, or refused */
  r = waiter ? mloop_aio_pool_submit_and_wait (p->pool, io, waiter)
    : mloop_aio_pool_submit (p->pool, io);
  if (r < 0)
    mloop_engine_abandon (e, io);
  return r < 0 ? r : 0;
}

int
mloop_pooled_submit (struct mloop_pooled *p, struct mloop_io *io)
{
  io->port = &p->port;
  return submit_prepared (p, io, mloop_engine_prepare (p->engine, io), NULL);
}

int
mloop_pooled_submit_and_wait (struct mloop_pooled *p, struct mloop_io *io,
                              struct mloop_pool_waiter *waiter)
{
  io->port = &p->port;
  return submit_prepared (p, io, mloop_engine_prepare (p->engine, io),
                          waiter);
}

/* Each calling thread keeps one aligned scratch buffer for bounces, of
 * up to MLOOP_KEEP_BUFFER bytes.  nbdkit (1.32) hands plugins buffers
 * from realloc, aligned to 16 bytes only, so nearly every O_DIRECT
 * request needs a bounce; reusing the buffer saves an allocation per
 * typical request.  Larger requests bounce through a buffer of their own
 * that the engine unmaps when they complete: a scratch buffer grown to
 * the largest request would keep up to 64 MiB per nbdkit thread for
 * good.  Safe because a synchronous caller does nothing else until its
 * request completes.
 */
struct scratch {
  void *buf;
  size_t size;
};

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void
scratch_free (void *p)
{
  struct scratch *s = p;

  mloop_free_aligned (s->buf, s->size);
  free (s);
}

static void
scratch_key_create (void)
{
  pthread_key_create (&scratch_key, scratch_free);
}

/* Points IO at this thread's scratch buffer if IO will need a bounce. */
static void
attach_scratch (struct mloop_engine *e, struct mloop_io *io)
{
  uint32_t align = mloop_engine_info (e)->buffer_alignment;
  struct scratch *s;

  if (align == 1 || mloop_is_aligned ((uintptr_t) io->buf, align) ||
      io->count > MLOOP_KEEP_BUFFER)
    return;
  pthread_once (&scratch_once, scratch_key_create);
  s = pthread_getspecific (scratch_key);
  if (s == NULL) {
    s = calloc (1, sizeof *s);
    if (s == NULL || pthread_setspecific (scratch_key, s) != 0) {
      free (s);
      return;                   /* the engine allocates instead */
    }
  }
  if (s->size < io->count) {
    void *bigger = mloop_alloc_aligned (io->count, align);

    if (bigger == NULL)
      return;
    mloop_free_aligned (s->buf, s->size);
    s->buf = bigger;
    s->size = io->count;
  }
  io->scratch = s->buf;
  io->scratch_size = s->size;
}

struct sync_wait {
  struct mloop_pool_waiter waiter;
  int error;
};

static void
sync_complete (struct mloop_io *io, int error)
{
  struct sync_wait *w = io->opaque;

  w->error = error;
  mloop_pool_waiter_done (&w->waiter);
}

static int
run (struct mloop_pooled *p, struct mloop_io *io)
{
  struct sync_wait w;
  int r;

  mloop_pool_waiter_init (&w.waiter);
  w.error = 0;
  io->complete = sync_complete;
  io->opaque = &w;
  attach_scratch (p->engine, io);
  r = mloop_pooled_submit_and_wait (p, io, &w.waiter);
  if (r == 0)
    r = -w.error;
  mloop_pool_waiter_destroy (&w.waiter);
  return r;
}

int
mloop_pooled_pread (struct mloop_pooled *p, void *buf, size_t count,
                    uint64_t offset)
{
  struct mloop_io io;

  memset (&io, 0, sizeof io);
  io.op = MLOOP_IO_READ;
  io.buf = buf;
  io.count = count;
  io.offset = offset;
  return run (p, &io);
}

int
mloop_pooled_pwrite (struct mloop_pooled *p, const void *buf, size_t count,
                     uint64_t offset, unsigned flags)
{
  struct mloop_io io;

  memset (&io, 0, sizeof io);
  io.op = MLOOP_IO_WRITE;
  io.flags = flags;
  io.buf = (void *) buf;       /* only read from, for a write */
  io.count = count;
  io.offset = offset;
  return run (p, &io);
}

/* A flush from a thread-per-request front end needs no ring: by the
 * time it is called, every write it covers has completed (the front end
 * replied to them), so fdatasync here, on the caller's thread, is exactly
 * the NBD contract and costs no handoff.
 */
int
mloop_pooled_flush (struct mloop_pooled *p)
{
  return mloop_engine_flush (p->engine);
}
