/* mloop — one Linux kernel AIO context. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "aio_ring.h"

/* io_submit's EAGAIN means "kernel resources exhausted right now"
 * (the ring is sized for 'depth', so not "ring full").  Retry this many
 * times, sleeping a little longer each time, before giving up.
 */
enum { SUBMIT_EAGAIN_RETRIES = 100 };

/* Events held by this process's contexts: the kernel charges each
 * io_setup(nr) to fs.aio-nr by nr.
 */
static atomic_uint reserved;

/* MLOOP_TEST_AIO_MAX=N: a test-only switch that makes io_setup fail with
 * EAGAIN, as fs.aio-max-nr would, once this process would hold more than
 * N events.  Lets the host-side tests meet the limit without lowering a
 * sysctl that every other process on the machine shares.
 */
static unsigned test_max;
static pthread_once_t test_max_once = PTHREAD_ONCE_INIT;

static void
read_test_max (void)
{
  const char *v = getenv ("MLOOP_TEST_AIO_MAX");

  if (v && *v)
    test_max = (unsigned) strtoul (v, NULL, 10);
}

int
mloop_aio_ring_init (struct mloop_aio_ring *ring, unsigned depth)
{
  int r;

  memset (ring, 0, sizeof *ring);
  pthread_once (&test_max_once, read_test_max);
  if (test_max && atomic_load (&reserved) + depth > test_max)
    return -EAGAIN;
  r = io_setup ((int) depth, &ring->ctx);
  if (r < 0) {
    ring->ctx = 0;
    return r;
  }
  ring->depth = depth;
  atomic_fetch_add (&reserved, depth);
  return 0;
}

int
mloop_aio_ring_init_fit (struct mloop_aio_ring *ring, unsigned want,
                         unsigned floor, bool *limited)
{
  unsigned depth = want;
  int r;

  *limited = false;
  if (floor > want)
    floor = want;
  for (;;) {
    r = mloop_aio_ring_init (ring, depth);
    if (r != -EAGAIN)
      return r < 0 ? r : (int) depth;
    *limited = true;
    if (depth == floor)
      return r;
    depth = depth / 2 > floor ? depth / 2 : floor;
  }
}

/* A number from /proc/sys/fs, or -1. */
static long
read_fs_sysctl (const char *name)
{
  char path[64];
  long v = -1;
  FILE *f;

  snprintf (path, sizeof path, "/proc/sys/fs/%s", name);
  f = fopen (path, "re");
  if (f) {
    if (fscanf (f, "%ld", &v) != 1)
      v = -1;
    fclose (f);
  }
  return v;
}

void
mloop_aio_limit_message (char *buf, size_t len, unsigned want)
{
  long max = read_fs_sysctl ("aio-max-nr");
  long nr = read_fs_sysctl ("aio-nr");
  /* A suggestion: twice the limit, or what is in use and asked for,
   * in steps of the default (65536).
   */
  long need = 2 * max > nr + (long) want ? 2 * max : nr + (long) want;
  long raise = (need + 65535) / 65536 * 65536;

  if (test_max)
    snprintf (buf, len, "kernel AIO events exhausted: %u more do not fit "
              "MLOOP_TEST_AIO_MAX=%u (a test switch standing in for "
              "fs.aio-max-nr)", want, test_max);
  else
    snprintf (buf, len, "kernel AIO events exhausted: %u more do not fit "
              "fs.aio-max-nr=%ld (fs.aio-nr=%ld already reserved); "
              "raise it with `sysctl fs.aio-max-nr=%ld`", want, max, nr,
              raise);
}

/* Whether a context of DEPTH events fits the limit now, by the kernel's
 * own count (io_setup charges fs.aio-nr with the events asked for and
 * refuses past fs.aio-max-nr).  True when the count cannot be read: the
 * context's own io_setup then says.
 */
static bool
room_by_count (unsigned depth)
{
  long max, nr;

  pthread_once (&test_max_once, read_test_max);
  if (test_max)
    return atomic_load (&reserved) + depth <= test_max;
  max = read_fs_sysctl ("aio-max-nr");
  nr = read_fs_sysctl ("aio-nr");
  return max < 0 || nr < 0 || nr + (long) depth <= max;
}

int
mloop_aio_check_room (char *err, size_t errlen)
{
  /* Set once a context opened: io_setup works in this process (no
   * sandbox forbids it), and later checks only count.  Opening and
   * destroying one per check costs an RCU grace period in io_destroy
   * (30-40 ms under emulation), at every open of a process that serves
   * many images.
   */
  static atomic_bool setup_works;
  struct mloop_aio_ring ring;
  int r;

  if (atomic_load (&setup_works)) {
    if (room_by_count (MLOOP_AIO_RING_FLOOR))
      return 0;
    mloop_aio_limit_message (err, errlen, MLOOP_AIO_RING_FLOOR);
    return -1;
  }
  r = mloop_aio_ring_init (&ring, MLOOP_AIO_RING_FLOOR);
  if (r == 0) {
    mloop_aio_ring_destroy (&ring);
    atomic_store (&setup_works, true);
    return 0;
  }
  if (r == -EAGAIN)
    mloop_aio_limit_message (err, errlen, MLOOP_AIO_RING_FLOOR);
  else
    snprintf (err, errlen, "io_setup: %s", strerror (-r));
  return -1;
}

unsigned
mloop_aio_reserved (void)
{
  return atomic_load (&reserved);
}

void
mloop_aio_ring_destroy (struct mloop_aio_ring *ring)
{
  if (ring->ctx) {
    io_destroy (ring->ctx);
    atomic_fetch_sub (&reserved, ring->depth);
    ring->ctx = 0;
  }
}

int
mloop_aio_ring_submit (struct mloop_aio_ring *ring, struct iocb **iocbs,
                       int n)
{
  int submitted = 0;
  int eagain = 0;

  while (submitted < n) {
    /* libaio returns -errno rather than setting errno. */
    int r = io_submit (ring->ctx, n - submitted, iocbs + submitted);

    if (r > 0) {
      submitted += r;
      eagain = 0;
      continue;
    }
    if (r == -EINTR)
      continue;
    if (r == -EAGAIN && eagain++ < SUBMIT_EAGAIN_RETRIES) {
      struct timespec ts = { 0, 10000L * eagain };
      nanosleep (&ts, NULL);
      continue;
    }
    if (r == 0)
      r = -EAGAIN;
    return submitted > 0 ? submitted : r;
  }
  return submitted;
}

int
mloop_aio_ring_reap (struct mloop_aio_ring *ring, long min_nr,
                     struct io_event *events, long max_nr,
                     struct timespec *timeout)
{
  int r;

  do
    r = io_getevents (ring->ctx, min_nr, max_nr, events, timeout);
  while (r == -EINTR);
  return r;
}
