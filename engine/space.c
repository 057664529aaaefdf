/* mloop — trim, zero and extents.
 *
 * Offsets are the window's (backing.h) up to the system calls, which get
 * file offsets from file_pos(): the checks against the size and the
 * page-cache tail, and the extents reported, are all in the window.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/falloc.h>
#include <linux/fs.h>

#include "align.h"
#include "engine.h"
#include "file_store.h"
#include "overlay.h"
#include "space.h"
#include "unaligned.h"

/* Zeroes written per syscall on the slow path. */
#define ZERO_CHUNK (1u << 20)

static int
check_range (const struct mloop_file_store *e, uint64_t offset, uint64_t count,
             int past_end_error)
{
  const uint64_t size = mloop_backing_size (&e->backing);

  if (!e->backing.writable)
    return -EPERM;
  if (offset > size || count > size - offset)
    return -past_end_error;
  return 0;
}

/* The file offset of window offset OFFSET. */
static uint64_t
file_pos (const struct mloop_file_store *e, uint64_t offset)
{
  return mloop_backing_file_offset (&e->backing, offset);
}

static bool
is_unsupported (int err)
{
  return err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

int
mloop_fallocate (int fd, int mode, uint64_t offset, uint64_t count)
{
  int r;

  do
    r = fallocate (fd, mode, (off_t) offset, (off_t) count);
  while (r == -1 && errno == EINTR);
  return r == -1 ? -errno : 0;
}

static int
do_range_ioctl (int fd, unsigned long request, uint64_t offset,
                uint64_t count)
{
  uint64_t range[2] = { offset, count };

  return ioctl (fd, request, range) == -1 ? -errno : 0;
}

/* The slow path: write zeroes over an aligned range. */
static int
write_zeroes (struct mloop_file_store *e, uint64_t offset, uint64_t count)
{
  size_t chunk = count < ZERO_CHUNK ? (size_t) count : ZERO_CHUNK;
  void *zeroes = mloop_alloc_aligned (chunk, e->backing.logical_block_size);
  int r = 0;

  if (zeroes == NULL)
    return -ENOMEM;
  memset (zeroes, 0, chunk);
  while (count > 0 && r == 0) {
    const uint64_t tail = mloop_backing_buffered_from (&e->backing);
    size_t n = count < chunk ? (size_t) count : chunk;
    int fd = e->backing.fd;
    ssize_t w;

    /* Never a page of the page-cache tail through O_DIRECT. */
    if (offset >= tail)
      fd = e->backing.buffered_fd;
    else if (offset + n > tail)
      n = (size_t) (tail - offset);
    w = pwrite (fd, zeroes, n, (off_t) file_pos (e, offset));

    if (w == -1 && errno == EINTR)
      continue;
    if (w <= 0)
      r = w == 0 ? -EIO : -errno;
    else {
      offset += (uint64_t) w;
      count -= (uint64_t) w;
    }
  }
  mloop_free_aligned (zeroes, chunk);
  return r;
}

/* Zeroes an aligned range of a regular file. */
static int
zero_file_range (struct mloop_file_store *e, uint64_t offset, uint64_t count,
                 unsigned flags)
{
  int fd = e->backing.fd;
  int r;

  /* Without NO_HOLE, punching is the cheapest zero and frees space. */
  if (!(flags & MLOOP_ZERO_NO_HOLE)) {
    r = mloop_fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      file_pos (e, offset), count);
    if (r == 0 || !is_unsupported (-r))
      return r;
  }
  /* Zero range keeps the blocks allocated (as unwritten extents). */
  r = mloop_fallocate (fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                    file_pos (e, offset), count);
  if (r == 0 || !is_unsupported (-r))
    return r;
  if (flags & MLOOP_ZERO_FAST)
    return -ENOTSUP;
  return write_zeroes (e, offset, count);
}

/* Zeroes an aligned range of a block device. */
static int
zero_device_range (struct mloop_file_store *e, uint64_t offset, uint64_t count,
                   unsigned flags)
{
  int fd = e->backing.fd;

  if (flags & MLOOP_ZERO_FAST) {
    /* Punching a block device zeroes without the kernel's fallback to
     * writing zeroes (BLKDEV_ZERO_NOFALLBACK): EOPNOTSUPP when the device
     * has no fast way.  Keeping the range allocated has no fast form.
     */
    int r;

    if (flags & MLOOP_ZERO_NO_HOLE)
      return -ENOTSUP;
    r = mloop_fallocate (fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      file_pos (e, offset), count);
    return r < 0 && is_unsupported (-r) ? -ENOTSUP : r;
  }
  /* The kernel picks the best way (write-zeroes, then writing zeroes). */
  return do_range_ioctl (fd, BLKZEROOUT, file_pos (e, offset), count);
}

/* Zeroes the partial blocks at either end of [offset, offset+count) by
 * read-modify-write, leaving the aligned middle to the caller.
 */
static int
zero_partial_blocks (struct mloop_file_store *e, uint64_t offset, uint64_t count,
                     uint64_t mid_start, uint64_t mid_end)
{
  static const char zeroes[65536];
  const uint64_t end = offset + count;
  struct mloop_io io;
  int r = 0;

  memset (&io, 0, sizeof io);
  io.op = MLOOP_IO_WRITE;
  io.buf = (void *) zeroes;
  if (offset < mid_start) {
    io.offset = offset;
    io.count = (size_t) ((mid_start < end ? mid_start : end) - offset);
    r = mloop_sync_rw (e, &io);
  }
  /* mid_end >= mid_start, so the tail never overlaps the head. */
  if (r == 0 && mid_end < end) {
    io.offset = mid_end;
    io.count = (size_t) (end - mid_end);
    r = mloop_sync_rw (e, &io);
  }
  return r;
}

enum space_op { SPACE_TRIM, SPACE_ZERO };

static int
space_change (struct mloop_file_store *e, enum space_op op, uint64_t offset,
              uint64_t count, unsigned flags)
{
  /* Block device ioctls want logical-block alignment even without
   * O_DIRECT; files only with it.
   */
  const uint32_t align = e->backing.is_block_device
    ? e->backing.logical_block_size : mloop_backing_alignment (&e->backing);
  const uint64_t end = offset + count;
  uint64_t mid_start = mloop_round_up (offset, align);
  uint64_t mid_end = mloop_round_down (end, align);
  int r = 0;

  if (count == 0)
    return 0;
  if (mid_end < mid_start)      /* within one block */
    mid_end = mid_start;

  /* The middle first: if a fast zero is refused, nothing has changed. */
  if (mid_end > mid_start) {
    uint64_t n = mid_end - mid_start;

    if (e->backing.is_block_device)
      r = op == SPACE_TRIM
        ? do_range_ioctl (e->backing.fd, BLKDISCARD,
                          file_pos (e, mid_start), n)
        : zero_device_range (e, mid_start, n, flags);
    else
      /* A trim on a file is a zero that may punch: it then reads back as
       * zeroes, which the plugin promises.
       */
      r = zero_file_range (e, mid_start, n,
                           op == SPACE_TRIM ? 0 : flags);
  }
  /* A device discard is advisory: partial blocks are left alone. */
  if (r == 0 && !(op == SPACE_TRIM && e->backing.is_block_device))
    r = zero_partial_blocks (e, offset, count, mid_start, mid_end);
  if (r == 0 && (flags & MLOOP_IO_FUA) && fdatasync (e->backing.fd) == -1)
    r = -errno;
  return r;
}

int
mloop_file_store_trim (struct mloop_store *store, uint64_t offset,
                       uint64_t count, unsigned flags)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  int r = check_range (e, offset, count, EINVAL);

  if (r < 0)
    return r;
  if (e->overlay)
    return mloop_overlay_trim (e->overlay, &e->backing, &e->rmw_lock,
                               offset, count, flags);
  return space_change (e, SPACE_TRIM, offset, count, flags & MLOOP_IO_FUA);
}

int
mloop_file_store_zero (struct mloop_store *store, uint64_t offset,
                       uint64_t count, unsigned flags)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  int r = check_range (e, offset, count, ENOSPC);

  if (r < 0)
    return r;
  if (e->overlay)
    return mloop_overlay_zero (e->overlay, &e->backing, &e->rmw_lock,
                               offset, count, flags);
  return space_change (e, SPACE_ZERO, offset, count, flags);
}

int
mloop_file_extents (int fd, uint64_t base, bool is_block_device,
                    uint64_t pos, uint64_t end, bool req_one,
                    mloop_extent_fn fn, void *opaque)
{
  int r;

  if (is_block_device)
    return end > pos ? fn (opaque, pos, end - pos, false) : 0;

  /* lseek speaks file offsets; everything past the window's end is
   * clipped to it, so an extent never reaches beyond the window.
   */
  while (pos < end) {
    off_t data = lseek (fd, (off_t) (base + pos), SEEK_DATA);
    off_t hole;
    uint64_t at;

    if (data == -1 && errno == ENXIO)
      at = end;                 /* a hole to the end of the file */
    else if (data == -1)
      /* The filesystem cannot say: report data, never a false hole. */
      return fn (opaque, pos, end - pos, false);
    else
      at = (uint64_t) data - base;
    if (at > pos) {
      uint64_t n = (at < end ? at : end) - pos;

      if ((r = fn (opaque, pos, n, true)) < 0)
        return r;
      pos += n;
      if (req_one || pos >= end)
        break;
    }
    hole = lseek (fd, (off_t) (base + pos), SEEK_HOLE);
    at = hole == -1 || (uint64_t) hole <= base + pos
      ? end : (uint64_t) hole - base;
    {
      uint64_t n = (at < end ? at : end) - pos;

      if ((r = fn (opaque, pos, n, false)) < 0)
        return r;
      pos += n;
    }
    if (req_one)
      break;
  }
  return 0;
}

int
mloop_file_store_extents (struct mloop_store *store, uint64_t offset,
                          uint64_t count, bool req_one, mloop_extent_fn fn,
                          void *opaque)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  const uint64_t size = mloop_backing_size (&e->backing);

  if (offset > size || count > size - offset)
    return -EINVAL;
  if (e->overlay)
    return mloop_overlay_extents (e->overlay, &e->backing, offset, count,
                                  req_one, fn, opaque);
  return mloop_file_extents (e->backing.fd, e->backing.offset,
                             e->backing.is_block_device, offset,
                             offset + count, req_one, fn, opaque);
}
