/* mloop — one Linux kernel AIO context (io_setup/io_submit/io_getevents).
 *
 * Thin, but the one place that knows io_submit's quirks: it may accept
 * only some of a batch, fail with EAGAIN when the kernel is short of
 * resources, or be interrupted.
 */
#ifndef MLOOP_AIO_RING_H
#define MLOOP_AIO_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>
#include <libaio.h>

/* Requests one of the plugin's contexts keeps in flight (queue-depth=).
 * nbdkit works on one request per thread, 16 threads per connection by
 * default: four contexts of 32 hold every request of a device with up to
 * eight connections, and 256 such devices reserve half of the default
 * fs.aio-max-nr (65536).
 */
#define MLOOP_QUEUE_DEPTH_DEFAULT  32
#define MLOOP_QUEUE_DEPTH_MAX      4096

struct mloop_aio_ring {
  io_context_t ctx;
  unsigned depth;
};

/* The smallest context mloop_aio_ring_init_fit() settles for. */
#define MLOOP_AIO_RING_FLOOR 8

/* Returns 0, or a negative errno: EAGAIN when the system-wide limit
 * fs.aio-max-nr has no room for DEPTH more events (fs.aio-nr counts
 * what every process has reserved).
 */
int mloop_aio_ring_init (struct mloop_aio_ring *ring, unsigned depth);

/* Like mloop_aio_ring_init() for up to WANT requests, but when the
 * system-wide limit refuses, halves the depth down to FLOOR before
 * giving up: a smaller context limits how much IO is in flight, it
 * does not fail any.  Returns the depth obtained (ring->depth), or a
 * negative errno.  *LIMITED tells whether the limit cut it short.
 */
int mloop_aio_ring_init_fit (struct mloop_aio_ring *ring, unsigned want,
                             unsigned floor, bool *limited);

/* One line saying that fs.aio-max-nr stopped a context of WANT events,
 * with fs.aio-nr and the sysctl that raises it.
 */
void mloop_aio_limit_message (char *buf, size_t len, unsigned want);

/* Whether a context of the floor's depth can be opened now: 0, or -1
 * with a one-line reason in ERR (for EAGAIN, mloop_aio_limit_message()).
 * What a server checks before it starts, so that a system at its limit
 * refuses the attach, in so many words, instead of the first IO.  The
 * process's first check opens one (io_setup may be forbidden here);
 * later ones compare fs.aio-nr with fs.aio-max-nr.
 */
int mloop_aio_check_room (char *err, size_t errlen);

/* Events this process holds in AIO contexts now (each io_setup's nr). */
unsigned mloop_aio_reserved (void);
void mloop_aio_ring_destroy (struct mloop_aio_ring *ring);

/* Submits all N iocbs.  Retries after EINTR, after a partial submission,
 * and (with a short back-off, bounded) after EAGAIN.  Returns the number
 * submitted (N on success) or a negative errno when none of the first
 * remaining iocb could be submitted; the caller owns the unsubmitted ones.
 */
int mloop_aio_ring_submit (struct mloop_aio_ring *ring,
                           struct iocb **iocbs, int n);

/* Waits for at least MIN_NR completions (0 = don't wait), up to MAX_NR,
 * or until TIMEOUT (NULL = forever).  Returns the count or a negative
 * errno; EINTR is retried internally.
 */
int mloop_aio_ring_reap (struct mloop_aio_ring *ring, long min_nr,
                         struct io_event *events, long max_nr,
                         struct timespec *timeout);

#endif /* MLOOP_AIO_RING_H */
