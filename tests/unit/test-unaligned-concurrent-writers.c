/* Concurrent unaligned writes to different bytes of the same blocks all
 * land (engine/unaligned.c): each read-modify-write holds its blocks
 * under the engine's range lock, so no writer reads a block, loses the
 * race and writes back a copy without another writer's bytes.  On a
 * real file opened with O_DIRECT.
 *
 * Thread model: WRITERS threads share three blocks byte by byte (byte i
 * of the region belongs to writer i % WRITERS) and each writes its bytes
 * one at a time, all at once, ROUNDS times; after each round the main
 * thread checks that every byte holds its writer's value.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "direct-image.h"
#include "engine.h"
#include "unaligned.h"
#include "unit.h"

#define IMAGE_SIZE (1u << 20)
#define WRITERS 4
#define ROUNDS 3

static struct mloop_engine e;
static uint64_t region_start, region_len;
static unsigned round_no;
static pthread_barrier_t start;

/* What writer (i % WRITERS) leaves at byte I of the image in round R. */
static unsigned char
written (uint64_t i, unsigned r)
{
  return (unsigned char) (i * 31 + r * 7 + 1);
}

static void *
writer_main (void *arg)
{
  const unsigned id = (unsigned) (uintptr_t) arg;
  unsigned char buf[1];

  pthread_barrier_wait (&start);
  for (uint64_t i = region_start + id; i < region_start + region_len;
       i += WRITERS) {
    struct mloop_io io = {
      .op = MLOOP_IO_WRITE, .buf = buf, .count = 1, .offset = i,
    };
    int r;

    buf[0] = written (i, round_no);
    r = mloop_sync_rw (direct_image_store (&e), &io);
    CHECK (r == 0, "writer %u: byte %llu: %s", id, (unsigned long long) i,
           strerror (-r));
  }
  return NULL;
}

int
main (void)
{
  unsigned char *before = malloc (IMAGE_SIZE), *disk = malloc (IMAGE_SIZE);
  pthread_t t[WRITERS];
  const char *path;
  uint32_t lbs;

  CHECK (before && disk, "out of memory");
  for (size_t i = 0; i < IMAGE_SIZE; i++)
    before[i] = (unsigned char) (i ^ (i >> 8));
  path = direct_image_open (&e, before, IMAGE_SIZE);
  lbs = direct_image_store (&e)->backing.logical_block_size;
  /* Three blocks, from the middle of one to the middle of the fourth:
   * writers' bytes meet in partial heads, tails and whole blocks.
   */
  region_start = lbs + lbs / 2;
  region_len = 3 * (uint64_t) lbs;

  for (round_no = 0; round_no < ROUNDS; round_no++) {
    CHECK (pthread_barrier_init (&start, NULL, WRITERS) == 0, "barrier");
    for (uintptr_t i = 0; i < WRITERS; i++)
      CHECK (pthread_create (&t[i], NULL, writer_main, (void *) i) == 0,
             "pthread");
    for (int i = 0; i < WRITERS; i++)
      pthread_join (t[i], NULL);
    pthread_barrier_destroy (&start);

    direct_image_read (path, disk, IMAGE_SIZE);
    for (uint64_t i = 0; i < IMAGE_SIZE; i++) {
      bool mine = i >= region_start && i < region_start + region_len;
      unsigned char want = mine ? written (i, round_no) : before[i];

      CHECK (disk[i] == want,
             "round %u: byte %llu (%s) is %#x, expected %#x: a concurrent "
             "read-modify-write lost it (block size %u)", round_no,
             (unsigned long long) i,
             mine ? "written by a writer" : "outside the region", disk[i],
             want, lbs);
    }
  }

  mloop_engine_close (&e);
  free (before);
  free (disk);
  printf ("ok: %d writers x %llu bytes of %u-byte blocks, %d rounds, all "
          "landed\n", WRITERS, (unsigned long long) region_len / WRITERS, lbs,
          ROUNDS);
  return 0;
}
