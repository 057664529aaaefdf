/* mloop — synchronous helpers over the asynchronous engine.
 *
 * The calling thread submits with io_submit itself and then sleeps on a
 * semaphore until the worker that reaps the completion posts it: one
 * wake-up per request, no queue in between.
 */
#include <errno.h>
#include <semaphore.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

struct sync_wait {
  sem_t done;
  int error;
};

static void
sync_complete (struct mloop_io *io, int error)
{
  struct sync_wait *w = io->opaque;

  w->error = error;
  sem_post (&w->done);
}

static int
run (struct mloop_engine *e, struct mloop_io *io)
{
  struct sync_wait w;
  int r;

  sem_init (&w.done, 0, 0);
  w.error = 0;
  io->complete = sync_complete;
  io->opaque = &w;
  r = mloop_engine_submit (e, io);
  if (r == 0) {
    while (sem_wait (&w.done) == -1 && errno == EINTR)
      ;
    r = -w.error;
  }
  sem_destroy (&w.done);
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
