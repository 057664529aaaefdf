/* A second writer to a cluster whose first write is still recording it
 * in the overlay's map is not answered before the cluster's map word is
 * in the file (engine/overlay.c, mloop_overlay_mark).  Were it answered
 * earlier, a FLUSH answered after it could sync a file without that
 * word, and after a power cut the cluster would read the base: a
 * flushed write lost.
 *
 * Thread model: the main thread writes a cluster new to the overlay
 * (the first writer).  The overlay's before_map_write seam stops it
 * with the map lock held, just before its map word goes to the file;
 * there, on the first writer's thread, the test starts a second writer
 * to the same cluster and waits SECOND_WRITER_MS for it: it must still
 * be waiting then, and the cluster must not yet show as in the overlay
 * (a writer deciding by that would skip recording it; this check needs
 * no clock).  Whenever the second writer is answered, the word must be
 * in the file.  On real files, through the
 * page cache (the map's path).  About 1 s (the wait), in the unit
 * suite of every tier.
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "align.h"
#include "backing.h"
#include "overlay.h"
#include "range_lock.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define CLUSTER_INDEX 5u
#define SECOND_WRITER_MS 1000

static struct mloop_overlay ov;
static struct mloop_backing base;
static struct mloop_range_lock lock;
static const char *overlay_path;
static bool in_window;

static pthread_mutex_t second_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t second_cond = PTHREAD_COND_INITIALIZER;
static bool second_done;
static bool second_word_in_file;

/* Whether cluster CLUSTER_INDEX's bit is in the overlay file's map, as
 * anyone reading the file (or syncing it) now sees it.
 */
static bool
bit_in_file (void)
{
  uint64_t word;
  int fd = open (overlay_path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0, "%s: %s", overlay_path, strerror (errno));
  CHECK (pread (fd, &word, sizeof word,
                (off_t) (ov.map_offset + CLUSTER_INDEX / 64 * sizeof word))
         == (ssize_t) sizeof word, "reading the map: %s", strerror (errno));
  close (fd);
  return (le64toh (word) >> (CLUSTER_INDEX % 64)) & 1;
}

static void
write_cluster (unsigned char fill)
{
  char *buf = mloop_alloc_aligned (MLOOP_OVERLAY_CLUSTER,
                                   MLOOP_OVERLAY_CLUSTER);
  int r;

  CHECK (buf != NULL, "no memory");
  memset (buf, fill, MLOOP_OVERLAY_CLUSTER);
  r = mloop_overlay_rw (&ov, &base, &lock, true, buf, MLOOP_OVERLAY_CLUSTER,
                        (uint64_t) CLUSTER_INDEX * MLOOP_OVERLAY_CLUSTER,
                        false);
  CHECK (r == 0, "write of 0x%02x: %s", fill, strerror (-r));
  mloop_free_aligned (buf, MLOOP_OVERLAY_CLUSTER);
}

static void *
second_writer (void *arg)
{
  (void) arg;
  write_cluster (0x22);
  /* Answered here: the map word must already be in the file. */
  pthread_mutex_lock (&second_lock);
  second_word_in_file = bit_in_file ();
  second_done = true;
  pthread_cond_signal (&second_cond);
  pthread_mutex_unlock (&second_lock);
  return NULL;
}

static void
before_map_write (struct mloop_overlay *o, uint64_t word)
{
  static pthread_t second;
  static bool started;
  struct timespec until;

  if (started || word != CLUSTER_INDEX / 64)
    return;             /* the second writer's own turn, later */
  started = in_window = true;
  CHECK (!bit_in_file (), "the map word is in the file before it is written");
  CHECK (pthread_create (&second, NULL, second_writer, NULL) == 0,
         "pthread_create");
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += SECOND_WRITER_MS / 1000;
  pthread_mutex_lock (&second_lock);
  while (!second_done &&
         pthread_cond_timedwait (&second_cond, &second_lock, &until) == 0)
    ;
  CHECK (!second_done, "the second writer was answered while the first "
         "writer's map word was not in the file");
  pthread_mutex_unlock (&second_lock);
  /* Whatever the clock did: what a writer decides by must not yet say
   * the cluster is in the overlay.
   */
  CHECK (mloop_overlay_where (o, (uint64_t) CLUSTER_INDEX *
                              MLOOP_OVERLAY_CLUSTER, MLOOP_OVERLAY_CLUSTER)
         == MLOOP_OVERLAY_IN_BASE,
         "the cluster shows as in the overlay while its map word is not "
         "in the file: a writer deciding by it would skip recording it");
  in_window = false;
  /* Joined by main, after the first writer is answered. */
  pthread_detach (second);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096];

  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  overlay_path = path;
  unit_make_image (base_path, BASE_SIZE);
  unit_open_overlay (&base, &ov, base_path, path);
  mloop_range_lock_init (&lock);
  ov.before_map_write = before_map_write;

  write_cluster (0x11);
  CHECK (!in_window, "the seam was left half-way");
  CHECK (bit_in_file (), "the first writer was answered without its word");
  /* The second writer ends once the first lets go of the map. */
  for (;;) {
    bool done;

    pthread_mutex_lock (&second_lock);
    done = second_done;
    pthread_mutex_unlock (&second_lock);
    if (done)
      break;
    unit_sleep_ms (10);
  }
  CHECK (second_word_in_file, "the second writer was answered before the "
         "cluster's map word was in the file");

  mloop_range_lock_destroy (&lock);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  printf ("ok: a second writer waits for the cluster's map word\n");
  return 0;
}
