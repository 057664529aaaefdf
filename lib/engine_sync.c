/* mloop — synchronous helpers over the engine.
 *
 * The calling thread submits with io_submit itself and then waits: in
 * CALLER_REAPS mode by reaping the ring itself when no other thread is
 * (see worker_pool.h), so a request costs one sleep and no handoff.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

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
run (struct mloop_engine *e, struct mloop_io *io)
{
  struct sync_wait w;
  int r;

  mloop_pool_waiter_init (&w.waiter);
  w.error = 0;
  io->complete = sync_complete;
  io->opaque = &w;
  r = mloop_engine_submit_and_wait (e, io, &w.waiter);
  if (r == 0)
    r = -w.error;
  mloop_pool_waiter_destroy (&w.waiter);
  return r;
}

int
mloop_engine_pread (struct mloop_engine *e, void *buf, size_t count,
                    uint64_t offset)
{
  struct mloop_io io;

  memset (&io, 0, sizeof io);
  io.op = MLOOP_IO_READ;
  io.buf = buf;
  io.count = count;
  io.offset = offset;
  return run (e, &io);
}

int
mloop_engine_pwrite (struct mloop_engine *e, const void *buf, size_t count,
                     uint64_t offset, unsigned flags)
{
  struct mloop_io io;

  memset (&io, 0, sizeof io);
  io.op = MLOOP_IO_WRITE;
  io.flags = flags;
  io.buf = (void *) buf;       /* only read from, for a write */
  io.count = count;
  io.offset = offset;
  return run (e, &io);
}

/* A flush from a thread-per-request front end needs no worker: by the
 * time it is called, every write it covers has completed (the front end
 * replied to them), so fdatasync here, on the caller's thread, is exactly
 * the NBD contract and costs no handoff.
 */
int
mloop_engine_flush (struct mloop_engine *e)
{
  if (fdatasync (e->backing.fd) == -1)
    return -errno;
  return 0;
}
