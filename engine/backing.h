/* mloop — the backing store: an image file or a block device.
 *
 * Opening decides everything later IO depends on: the window served (the
 * whole file, or the part --offset and --sizelimit name), its size, the
 * logical block size (the O_DIRECT alignment), whether O_DIRECT is in
 * use, and whether the store is writable.  Nothing here ever creates,
 * truncates or otherwise modifies the file.
 *
 * Coordinates: every offset the engine takes or reports is relative to
 * the window; mloop_backing_file_offset() turns one into a file offset,
 * and only the system calls see those.
 */
#ifndef MLOOP_BACKING_H
#define MLOOP_BACKING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "parse.h"

/* The largest page-cache folio assumed when the kernel does not publish
 * its PMD size (transparent_hugepage/hpage_pmd_size): x86-64's 2 MiB.
 */
#define MLOOP_PAGE_CACHE_FOLIO_MAX (2u << 20)

enum mloop_direct_mode {
  MLOOP_DIRECT_AUTO,    /* O_DIRECT, falling back to buffered IO */
  MLOOP_DIRECT_ON,      /* O_DIRECT or fail */
  MLOOP_DIRECT_OFF,     /* buffered IO */
};

struct mloop_backing {
  char *path;
  /* The descriptor all aligned IO goes through: O_DIRECT when 'direct'. */
  int fd;
  /* A buffered descriptor on the same file.  Equal to 'fd' when !direct.
   * Used only for the page-cache tail below.
   */
  int buffered_fd;
  /* The window: the file's bytes [offset, offset + size) are served, as
   * bytes [0, size).  offset is 0 and size the file's size unless a
   * front end asked for less (losetup's --offset and --sizelimit).
   */
  uint64_t offset;
  uint64_t size;
  uint64_t sizelimit;           /* the window's limit; 0: none */
  /* The page-cache tail: bytes from here to 'size' are read and written
   * through buffered_fd only, never through the O_DIRECT 'fd'.  A file
   * whose size is not a multiple of the logical block size has a last
   * block O_DIRECT cannot write without growing the file, and a page
   * reached both through the page cache and with O_DIRECT makes the
   * kernel fail later fdatasyncs with EIO.  So the tail starts at a
   * boundary no page-cache folio crosses (the largest folio size, see
   * design.md "The tail of an odd-sized image").  Equal to 'size' when
   * there is no such tail (block devices, aligned sizes, buffered IO).
   * Decided on the whole file, in file coordinates, and then expressed
   * relative to the window (0 when the window starts in the tail), so
   * that every server of any window of one file agrees on which pages
   * are the page cache's.
   */
  uint64_t buffered_from;
  /* Logical block size: the O_DIRECT alignment for offsets, lengths and
   * buffer addresses.  512 or 4096 in practice.
   */
  uint32_t logical_block_size;
  bool is_block_device;
  bool direct;
  bool writable;
  /* Set when direct=auto had to fall back to buffered IO. */
  bool direct_fallback;
};

/* Parses an on/off setting: "on", "true", "yes" or "1", "off", "false",
 * "no" or "0", in any case.  Returns 0 and sets *ON, or -EINVAL.  Every
 * front end's on|off options go through it.
 */
int mloop_on_off_parse (const char *str, bool *on);

/* Parses "auto" or an on/off setting (mloop_on_off_parse).
 * Returns 0 and sets *MODE, or -EINVAL for anything else.
 */
int mloop_direct_mode_parse (const char *str, enum mloop_direct_mode *mode);

/* The part of the file to serve: from OFFSET, at most SIZELIMIT bytes
 * (0: to the end of the file).
 */
struct mloop_window {
  uint64_t offset;
  uint64_t sizelimit;
};

/* The descriptor PATH names if it names one of this process's open
 * files ("/proc/self/fd/N", "/dev/fd/N"), else -1.  Such a file is
 * served as it is open, never opened again: a reopen through /proc is
 * checked against whoever runs the server (root, for an image a user's
 * attach passed) rather than whoever opened it, which would read what
 * only root may and fail where root may not (root-squashed NFS).
 */
int mloop_backing_named_descriptor (const char *path);

/* Opens PATH (a regular file or a block device) and serves WINDOW of it
 * (NULL: all of it).  Opens read-write when possible and WANT_WRITE is
 * true, else read-only.  On failure returns a negative errno and writes
 * a one-line reason naming the cause into ERR; nothing is left open.
 * A window must start inside the file, and with O_DIRECT at a multiple
 * of the logical block size (EINVAL otherwise); a size limit that ends
 * inside the file is rounded down to that alignment (see design.md,
 * "Serving a window of the image").
 */
int mloop_backing_open (struct mloop_backing *b, const char *path,
                        enum mloop_direct_mode mode, bool want_write,
                        const struct mloop_window *window,
                        char *err, size_t errlen);

void mloop_backing_close (struct mloop_backing *b);

/* The size and the start of the page-cache tail, as IO threads read
 * them: mloop_backing_reprobe_size may change both while they run.
 */
static inline uint64_t
mloop_backing_size (const struct mloop_backing *b)
{
  return __atomic_load_n (&b->size, __ATOMIC_ACQUIRE);
}

static inline uint64_t
mloop_backing_buffered_from (const struct mloop_backing *b)
{
  return __atomic_load_n (&b->buffered_from, __ATOMIC_ACQUIRE);
}

/* Reads the size of the open store again (the file grew or shrank, the
 * block device was resized) and publishes it to IO threads running
 * concurrently: requests checked after it returns are checked against
 * the new size.  A page-cache tail, once there, only ever moves down,
 * so a range once served through the page cache is never afterwards
 * served with O_DIRECT.  0, or a negative errno with a one-line reason in ERR (the
 * old size then stays).
 */
int mloop_backing_reprobe_size (struct mloop_backing *b, char *err,
                                size_t errlen);

/* The alignment requests must meet to go through 'fd': the logical block
 * size with O_DIRECT, 1 without.
 */
static inline uint32_t
mloop_backing_alignment (const struct mloop_backing *b)
{
  return b->direct ? b->logical_block_size : 1;
}

/* The file offset of window offset OFFSET. */
static inline uint64_t
mloop_backing_file_offset (const struct mloop_backing *b, uint64_t offset)
{
  return b->offset + offset;
}

/* The alignment the window's start and end must keep: with O_DIRECT,
 * and for a block device's discard and zeroing ioctls, the logical block
 * size; a window of a regular file served through the page cache may
 * start and end on any byte.
 */
static inline uint32_t
mloop_backing_window_alignment (const struct mloop_backing *b)
{
  return b->direct || b->is_block_device ? b->logical_block_size : 1;
}

/* The block sizes both servers advertise to clients.  The minimum is 1:
 * the engine serves any request, those off the O_DIRECT alignment through
 * its read-modify-write path (unaligned.h), so strict clients (libnbd's
 * default) may send what they like and reach the last bytes of an image
 * of any size.  The preferred size is that alignment, which clients that
 * align for speed follow, and which mloop attach gives the kernel device
 * as its logical block size, as loop does with direct IO.
 */
#define MLOOP_MIN_BLOCK_SIZE 1

static inline uint32_t
mloop_backing_preferred_block_size (const struct mloop_backing *b)
{
  return b->logical_block_size;
}

#endif /* MLOOP_BACKING_H */
