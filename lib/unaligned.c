/* mloop — requests not aligned to the logical block size, on O_DIRECT. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "align.h"
#include "engine.h"
#include "unaligned.h"

/* Reads [offset, offset+count) of aligned blocks.  O_DIRECT reads stop
 * short at end of file; the bytes past SIZE (the served size, which need
 * not be a multiple of the block size) read as zeroes.  Stopping short
 * before SIZE means the file shrank under us: EIO.
 */
static int
full_pread (int fd, char *buf, size_t count, uint64_t offset, uint64_t size)
{
  while (count > 0) {
    ssize_t r = pread (fd, buf, count, (off_t) offset);

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
full_pwrite (int fd, const char *buf, size_t count, uint64_t offset,
             int rw_flags)
{
  while (count > 0) {
    struct iovec iov = { (void *) buf, count };
    ssize_t r = pwritev2 (fd, &iov, 1, (off_t) offset, rw_flags);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -errno;
    if (r == 0)
      return -EIO;
    buf += r;
    count -= (size_t) r;
    offset += (uint64_t) r;
  }
  return 0;
}

static int
write_merged (struct mloop_engine *e, struct mloop_io *io, char *block,
              uint64_t start, uint64_t end)
{
  const uint32_t lbs = e->backing.logical_block_size;
  const uint64_t size = e->backing.size;
  const int fd = e->backing.fd;
  const int rw_flags = (io->flags & MLOOP_IO_FUA) ? RWF_DSYNC : 0;
  struct mloop_range range;
  int r = 0;

  mloop_range_lock (&e->rmw_lock, &range, start, end);
  /* Only the partial blocks at either end hold bytes to preserve. */
  if (io->offset != start)
    r = full_pread (fd, block, lbs, start, size);
  if (r == 0 && io->offset + io->count != end &&
      (end - lbs != start || io->offset == start))
    r = full_pread (fd, block + (end - lbs - start), lbs, end - lbs, size);
  if (r == 0) {
    memcpy (block + (io->offset - start), io->buf, io->count);
    if (end <= size)
      r = full_pwrite (fd, block, end - start, start, rw_flags);
    else
      /* The file ends inside the last block: a whole-block O_DIRECT
       * write would grow it, so that one write goes through the page
       * cache, stopping at the end of the file.
       */
      r = full_pwrite (e->backing.buffered_fd, block, size - start, start,
                       rw_flags);
  }
  mloop_range_unlock (&e->rmw_lock, &range);
  return r;
}

int
mloop_unaligned_rw (struct mloop_engine *e, struct mloop_io *io)
{
  const uint32_t lbs = e->backing.logical_block_size;
  const uint64_t start = mloop_round_down (io->offset, lbs);
  const uint64_t end = mloop_round_up (io->offset + io->count, lbs);
  char *block;
  int r;

  block = mloop_alloc_aligned (end - start, lbs);
  if (block == NULL)
    return -ENOMEM;
  if (io->op == MLOOP_IO_READ) {
    r = full_pread (e->backing.fd, block, end - start, start,
                    e->backing.size);
    if (r == 0)
      memcpy (io->buf, block + (io->offset - start), io->count);
  }
  else
    r = write_merged (e, io, block, start, end);
  free (block);
  return r;
}
