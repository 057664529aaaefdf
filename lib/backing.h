/* mloop — the backing store: an image file or a block device.
 *
 * Opening decides everything later IO depends on: the size, the logical
 * block size (the O_DIRECT alignment), whether O_DIRECT is in use, and
 * whether the store is writable.  Nothing here ever creates, truncates or
 * otherwise modifies the file.
 */
#ifndef MLOOP_BACKING_H
#define MLOOP_BACKING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
   * Used only to write the last block of a file whose size is not a
   * multiple of the logical block size (see unaligned.c).
   */
  int buffered_fd;
  uint64_t size;
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

/* Parses "auto", "on" or "off" (also the usual boolean spellings).
 * Returns 0 and sets *MODE, or -1 for anything else.
 */
int mloop_direct_mode_parse (const char *str, enum mloop_direct_mode *mode);

/* Opens PATH (a regular file or a block device).  Opens read-write when
 * possible and WANT_WRITE is true, else read-only.  On failure returns -1
 * and writes a one-line reason naming the cause into ERR (ERRLEN bytes);
 * nothing is left open.
 */
int mloop_backing_open (struct mloop_backing *b, const char *path,
                        enum mloop_direct_mode mode, bool want_write,
                        char *err, size_t errlen);

void mloop_backing_close (struct mloop_backing *b);

/* The alignment requests must meet to go through 'fd': the logical block
 * size with O_DIRECT, 1 without.
 */
static inline uint32_t
mloop_backing_alignment (const struct mloop_backing *b)
{
  return b->direct ? b->logical_block_size : 1;
}

#endif /* MLOOP_BACKING_H */
