/* mloop — one Linux kernel AIO context. */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "aio_ring.h"

/* io_submit's EAGAIN means "kernel resources exhausted right now"
 * (the ring is sized for 'depth', so not "ring full").  Retry this many
 * times, sleeping a little longer each time, before giving up.
 */
enum { SUBMIT_EAGAIN_RETRIES = 100 };

int
mloop_aio_ring_init (struct mloop_aio_ring *ring, unsigned depth)
{
  int r;

  memset (ring, 0, sizeof *ring);
  ring->depth = depth;
  r = io_setup ((int) depth, &ring->ctx);
  return r < 0 ? r : 0;
}

void
mloop_aio_ring_destroy (struct mloop_aio_ring *ring)
{
  if (ring->ctx) {
    io_destroy (ring->ctx);
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
