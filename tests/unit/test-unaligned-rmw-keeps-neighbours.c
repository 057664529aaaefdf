/* An unaligned write through the engine's read-modify-write
 * (engine/unaligned.c) changes its own bytes and no others: the rest of
 * each partial block it touches, at its head and at its tail, is read
 * and written back unchanged, on a real file opened with O_DIRECT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "direct-image.h"
#include "engine.h"
#include "unaligned.h"
#include "unit.h"

#define IMAGE_SIZE (2u << 20)

/* Offsets and lengths in logical blocks (B) and bytes: B is 512 or
 * 4096, known only once the file is open.
 */
static const struct {
  const char *what;
  /* Offset B * block + plus, length B * blocks + bytes. */
  int block, plus, blocks, bytes;
} cases[] = {
  { "inside one block", 3, 100, 0, 10 },
  { "a block's first byte", 5, 0, 0, 1 },
  { "a block's last byte", 5, -1, 0, 1 },
  { "across a block boundary", 8, -5, 0, 10 },
  { "partial head, aligned end", 10, 7, 1, -7 },
  { "aligned start, partial tail", 12, 0, 1, 3 },
  { "partial head and tail, blocks between", 14, 1, 5, 0 },
  { "the image's first byte", 0, 0, 0, 1 },
  { "whole blocks (no partial one)", 21, 0, 2, 0 },
};

static unsigned char
byte_at (size_t i)
{
  return (unsigned char) (i * 13 + i / 512 + 1);
}

int
main (void)
{
  static struct mloop_engine e;
  unsigned char *expected = malloc (IMAGE_SIZE);
  unsigned char *disk = malloc (IMAGE_SIZE);
  unsigned char *buf = malloc (IMAGE_SIZE + 1);
  const char *path;
  uint32_t lbs;
  size_t n = sizeof cases / sizeof cases[0];

  CHECK (expected && disk && buf, "out of memory");
  for (size_t i = 0; i < IMAGE_SIZE; i++)
    expected[i] = byte_at (i);
  path = direct_image_open (&e, expected, IMAGE_SIZE);
  lbs = direct_image_store (&e)->backing.logical_block_size;

  for (size_t c = 0; c <= n; c++) {
    /* After the table, the image's last byte. */
    uint64_t offset = c < n ? (uint64_t) ((int64_t) lbs * cases[c].block +
                                          cases[c].plus) : IMAGE_SIZE - 1;
    size_t count = c < n ? (size_t) ((int64_t) lbs * cases[c].blocks +
                                     cases[c].bytes) : 1;
    const char *what = c < n ? cases[c].what : "the image's last byte";
    struct mloop_io io = {
      .op = MLOOP_IO_WRITE,
      .buf = buf + 1,           /* unaligned memory as well */
      .count = count,
      .offset = offset,
    };
    int r;

    for (size_t i = 0; i < count; i++)
      buf[1 + i] = expected[offset + i] = (unsigned char) ~expected[offset + i];
    r = mloop_sync_rw (direct_image_store (&e), &io);
    CHECK (r == 0, "%s: write of %zu bytes at %llu: %s", what, count,
           (unsigned long long) offset, strerror (-r));

    direct_image_read (path, disk, IMAGE_SIZE);
    for (size_t i = 0; i < IMAGE_SIZE; i++)
      CHECK (disk[i] == expected[i],
             "%s (%zu bytes at %llu, block size %u): byte %zu is %#x, "
             "expected %#x", what, count, (unsigned long long) offset, lbs,
             i, disk[i], expected[i]);
  }

  mloop_engine_close (&e);
  free (expected);
  free (disk);
  free (buf);
  printf ("ok: %zu unaligned writes kept their neighbours (block size %u)\n",
          n + 1, lbs);
  return 0;
}
