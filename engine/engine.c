/* mloop — the IO engine: request preparation and completion. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "aio_ring.h"
#include "align.h"
#include "engine.h"
#include "unaligned.h"

void
mloop_engine_config_init (struct mloop_engine_config *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->direct = MLOOP_DIRECT_AUTO;
  cfg->want_write = true;
}

int
mloop_engine_open (struct mloop_engine *e,
                   const struct mloop_engine_config *cfg,
                   char *err, size_t errlen)
{
  int r;

  memset (e, 0, sizeof *e);
  r = mloop_backing_open (&e->backing, cfg->path, cfg->direct,
                          cfg->want_write, &cfg->window, err, errlen);
  if (r < 0)
    return r;
  mloop_range_lock_init (&e->rmw_lock);
  return 0;
}

/* Submits one probe iocb on a scratch ring and returns its result. */
static long
probe_iocb (struct iocb *iocb)
{
  struct mloop_aio_ring ring;
  struct io_event ev;
  long res;
  int r;

  r = mloop_aio_ring_init (&ring, 1);
  if (r < 0)
    return r;
  r = mloop_aio_ring_submit (&ring, &iocb, 1);
  if (r != 1)
    res = r < 0 ? r : -EIO;
  else {
    r = mloop_aio_ring_reap (&ring, 1, &ev, 1, NULL);
    res = r == 1 ? (long) ev.res : -EIO;
  }
  mloop_aio_ring_destroy (&ring);
  return res;
}

/* Asks the kernel whether it takes RWF_DSYNC on AIO writes and
 * IOCB_CMD_FDSYNC, with harmless requests: a zero-length write and a
 * flush of an idle file.
 */
void
mloop_engine_probe_features (struct mloop_engine *e)
{
  struct iocb iocb;
  struct iovec iov = { NULL, 0 };

  if (e->backing.writable) {
    io_prep_pwritev2 (&iocb, e->backing.fd, &iov, 0, 0, RWF_DSYNC);
    e->fua_in_aio = probe_iocb (&iocb) >= 0;
  }
  io_prep_fdsync (&iocb, e->backing.fd);
  e->flush_in_aio = probe_iocb (&iocb) >= 0;
}

void
mloop_engine_close (struct mloop_engine *e)
{
  mloop_range_lock_destroy (&e->rmw_lock);
  mloop_backing_close (&e->backing);
}

/* Points the iocb at what remains of the transfer after io->done bytes. */
static void
prep_remaining (struct mloop_engine *e, struct mloop_io *io)
{
  char *data = (char *) (io->bounce ? io->bounce : io->buf) + io->done;
  size_t left = io->count - io->done;
  long long offset = (long long)
    mloop_backing_file_offset (&e->backing, io->offset + io->done);
  int rw_flags = 0;

  io->iov.iov_base = data;
  io->iov.iov_len = left;
  if (io->op == MLOOP_IO_READ)
    io_prep_preadv2 (&io->iocb, io->fd, &io->iov, 1, offset, 0);
  else {
    if ((io->flags & MLOOP_IO_FUA) && e->fua_in_aio)
      rw_flags = RWF_DSYNC;
    io_prep_pwritev2 (&io->iocb, io->fd, &io->iov, 1, offset, rw_flags);
  }
  io->iocb.data = io;
}

static void
release_bounce (struct mloop_io *io)
{
  if (io->bounce_allocated)
    mloop_free_aligned (io->bounce, io->count);
  io->bounce = NULL;
  io->bounce_allocated = false;
}

static void
finish (struct mloop_io *io, int error)
{
  if (io->bounce && error == 0 && io->op == MLOOP_IO_READ)
    memcpy (io->buf, io->bounce, io->count);
  release_bounce (io);
  io->complete (io, error);
}

/* Checks a read or write and decides how it reaches the disk:
 *   aligned offset, length and buffer  → AIO on the O_DIRECT descriptor,
 *                                        zero copy;
 *   aligned offset and length only     → AIO through an aligned bounce
 *                                        buffer (one copy);
 *   unaligned offset or length         → read-modify-write, synchronously
 *                                        (unaligned.c);
 *   any byte in the page-cache tail    → the buffered descriptor for
 *                                        those bytes, synchronously.
 * Returns MLOOP_PREPARED_AIO when the iocb is ready to submit,
 * MLOOP_PREPARED_BLOCKING for the synchronous paths, or a negative errno.
 */
static int
prepare_rw (struct mloop_engine *e, struct mloop_io *io)
{
  const struct mloop_backing *b = &e->backing;
  uint32_t lbs = b->logical_block_size;
  bool is_write = io->op == MLOOP_IO_WRITE;
  const uint64_t size = mloop_backing_size (b);

  if (io->count > MLOOP_MAX_REQUEST)
    return -EINVAL;
  if (io->offset > size || io->count > size - io->offset)
    return is_write ? -ENOSPC : -EINVAL;
  if (is_write && !b->writable)
    return -EPERM;

  io->fd = b->fd;
  io->bounce = NULL;
  io->bounce_allocated = false;
  io->done = 0;
  if (io->offset + io->count > mloop_backing_buffered_from (b))
    /* Reaches the page-cache tail of an odd-sized file. */
    return MLOOP_PREPARED_BLOCKING;
  if (b->direct && !mloop_io_is_direct_safe (io->buf, io->count, io->offset,
                                             lbs)) {
    if (mloop_is_aligned (io->offset, lbs) &&
        mloop_is_aligned (io->count, lbs)) {
      if (io->scratch && io->scratch_size >= io->count &&
          mloop_is_aligned ((uintptr_t) io->scratch, lbs))
        io->bounce = io->scratch;
      else {
        io->bounce = mloop_alloc_aligned (io->count, lbs);
        if (io->bounce == NULL)
          return -ENOMEM;
        io->bounce_allocated = true;
      }
      if (is_write)
        memcpy (io->bounce, io->buf, io->count);
    }
    else
      return MLOOP_PREPARED_BLOCKING;
  }
  prep_remaining (e, io);
  return MLOOP_PREPARED_AIO;
}

enum mloop_event_result
mloop_engine_complete_event (struct mloop_engine *e, struct mloop_io *io,
                             long res)
{
  int error = 0;

  if (res < 0)
    error = (int) -res;
  else if (io->op != MLOOP_IO_FLUSH) {
    io->done += (size_t) res;
    if (io->done < io->count) {
      if (res == 0 ||
          !mloop_is_aligned (io->done, mloop_backing_alignment (&e->backing)))
        /* End of file before the end of the request (O_DIRECT stops short
         * only there): the backing file shrank under us.
         */
        error = EIO;
      else {
        prep_remaining (e, io);
        return MLOOP_EVENT_RESUBMIT;
      }
    }
    else if (io->op == MLOOP_IO_WRITE && (io->flags & MLOOP_IO_FUA) &&
             !e->fua_in_aio) {
      /* Old kernel: FUA as write then fdatasync, on this thread. */
      if (fdatasync (io->fd) == -1)
        error = errno;
    }
  }
  finish (io, error);
  return MLOOP_EVENT_DONE;
}

int
mloop_engine_prepare (struct mloop_engine *e, struct mloop_io *io)
{
  switch (io->op) {
  case MLOOP_IO_READ:
  case MLOOP_IO_WRITE:
    if (io->count == 0) {
      if (io->op == MLOOP_IO_WRITE && !e->backing.writable)
        return -EPERM;
      io->bounce = NULL;
      io->bounce_allocated = false;
      finish (io, 0);
      return MLOOP_PREPARED_DONE;
    }
    return prepare_rw (e, io);
  case MLOOP_IO_FLUSH:
    io->bounce = NULL;
    io->bounce_allocated = false;
    io->fd = e->backing.fd;
    if (!e->flush_in_aio)
      return MLOOP_PREPARED_BLOCKING;
    io_prep_fdsync (&io->iocb, io->fd);
    io->iocb.data = io;
    return MLOOP_PREPARED_AIO;
  default:
    return -EINVAL;
  }
}

int
mloop_engine_perform_blocking (struct mloop_engine *e, struct mloop_io *io)
{
  if (io->op == MLOOP_IO_FLUSH)
    return fdatasync (io->fd) == -1 ? -errno : 0;
  return mloop_sync_rw (e, io);
}

long
mloop_engine_perform_event (struct mloop_engine *e, struct mloop_io *io)
{
  /* prep_remaining() left io->iov and the offset of what remains. */
  off_t offset = (off_t) (io->offset + io->done);
  int rw_flags = 0;
  ssize_t n;

  if (io->op == MLOOP_IO_FLUSH)
    return fdatasync (io->fd) == -1 ? -errno : 0;
  if (io->op == MLOOP_IO_WRITE && (io->flags & MLOOP_IO_FUA) &&
      e->fua_in_aio)
    rw_flags = RWF_DSYNC;
  do
    n = io->op == MLOOP_IO_READ
      ? preadv2 (io->fd, &io->iov, 1, offset, 0)
      : pwritev2 (io->fd, &io->iov, 1, offset, rw_flags);
  while (n == -1 && errno == EINTR);
  return n == -1 ? -errno : (long) n;
}

void
mloop_engine_complete_blocking (struct mloop_engine *e, struct mloop_io *io,
                                int result)
{
  finish (io, -result);
}

void
mloop_engine_abandon (struct mloop_engine *e, struct mloop_io *io)
{
  release_bounce (io);
}
