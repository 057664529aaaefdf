/* mloop — requests the AIO fast path cannot take.  See unaligned.h. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "align.h"
#include "fileio.h"
#include "engine.h"
#include "file_store.h"
#include "unaligned.h"

/* Reads [offset, offset+count) of aligned blocks (window coordinates,
 * like everything here but the system calls).  O_DIRECT reads stop
 * short at end of file; the bytes past the window's end (which need not
 * be a multiple of the block size when it is the file's end) read as
 * zeroes.  Stopping short before it means the file shrank under us: EIO.
 */
static int
full_pread (const struct mloop_backing *b, int fd, char *buf, size_t count,
            uint64_t offset)
{
  const uint64_t size = mloop_backing_size (b);

  while (count > 0) {
    ssize_t r = pread (fd, buf, count,
                       (off_t) mloop_backing_file_offset (b, offset));

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -errno;
    if (r == 0 || (size_t) r < count) {
      if (offset + (uint64_t) r < size)
        return -EIO;
      memset (buf + r, 0, count - (size_t) r);
      return 0;
    }
    buf += r;
    count -= (size_t) r;
    offset += (uint64_t) r;
  }
  return 0;
}

static int
full_pwrite (const struct mloop_backing *b, int fd, const char *buf,
             size_t count, uint64_t offset, int rw_flags)
{
  return mloop_pwrite_all (fd, buf, count,
                           mloop_backing_file_offset (b, offset), rw_flags);
}

/* Writes BUF (COUNT bytes at OFFSET, within the O_DIRECT part) into the
 * aligned range [start, end) that covers it: the partial blocks at either
 * end are read first, under the range lock, so concurrent writers to
 * other bytes of those blocks are not lost.
 */
static int
write_merged (struct mloop_file_store *e, const char *buf, size_t count,
              uint64_t offset, int rw_flags, char *block,
              uint64_t start, uint64_t end)
{
  const struct mloop_backing *b = &e->backing;
  const uint32_t lbs = b->logical_block_size;
  const int fd = b->fd;
  struct mloop_range range;
  int r = 0;

  mloop_range_lock (&e->rmw_lock, &range, start, end);
  /* Only the partial blocks at either end hold bytes to preserve. */
  if (offset != start)
    r = full_pread (b, fd, block, lbs, start);
  if (r == 0 && offset + count != end &&
      (end - lbs != start || offset == start))
    r = full_pread (b, fd, block + (end - lbs - start), lbs, end - lbs);
  if (r == 0) {
    memcpy (block + (offset - start), buf, count);
    r = full_pwrite (b, fd, block, end - start, start, rw_flags);
  }
  mloop_range_unlock (&e->rmw_lock, &range);
  return r;
}

/* COUNT bytes at OFFSET, all before the page-cache tail, on the O_DIRECT
 * descriptor through an aligned buffer covering them.
 */
static int
direct_rw (struct mloop_file_store *e, enum mloop_io_op op, char *buf,
           size_t count, uint64_t offset, int rw_flags, uint64_t tail)
{
  const uint32_t lbs = e->backing.logical_block_size;
  const uint64_t start = mloop_round_down (offset, lbs);
  const uint64_t end = mloop_round_up (offset + count, lbs);
  char *block;
  int r;

  /* The tail starts on a block boundary, so the covering range stops
   * short of it: no whole-block write can reach (or grow) the file's end.
   * TAIL is where the tail started when the request was split: a resize
   * may have moved it down since (backing.h).
   */
  assert (end <= tail);
  block = mloop_alloc_aligned (end - start, lbs);
  if (block == NULL)
    return -ENOMEM;
  if (op == MLOOP_IO_READ) {
    r = full_pread (&e->backing, e->backing.fd, block, end - start, start);
    if (r == 0)
      memcpy (buf, block + (offset - start), count);
  }
  else
    r = write_merged (e, buf, count, offset, rw_flags, block, start, end);
  mloop_free_aligned (block, end - start);
  return r;
}

/* COUNT bytes at OFFSET, all in the page-cache tail, on the buffered
 * descriptor: any alignment will do, and the page cache keeps concurrent
 * writers to different bytes of a page apart.
 */
static int
tail_rw (struct mloop_file_store *e, enum mloop_io_op op, char *buf,
         size_t count, uint64_t offset, int rw_flags)
{
  const int fd = e->backing.buffered_fd;

  if (op == MLOOP_IO_READ)
    return full_pread (&e->backing, fd, buf, count, offset);
  return full_pwrite (&e->backing, fd, buf, count, offset, rw_flags);
}

int
mloop_sync_rw (struct mloop_file_store *e, struct mloop_io *io)
{
  const uint64_t tail = mloop_backing_buffered_from (&e->backing);
  const uint64_t end = io->offset + io->count;
  const int rw_flags = (io->flags & MLOOP_IO_FUA) ? RWF_DSYNC : 0;
  char *buf = io->buf;
  size_t before_tail = 0;
  int r = 0;

  if (io->offset < tail)
    before_tail = (size_t) ((end < tail ? end : tail) - io->offset);
  if (before_tail > 0)
    r = direct_rw (e, io->op, buf, before_tail, io->offset, rw_flags, tail);
  if (r == 0 && before_tail < io->count)
    r = tail_rw (e, io->op, buf + before_tail, io->count - before_tail,
                 io->offset + before_tail, rw_flags);
  return r;
}
