/* mloop — one Linux kernel AIO context (io_setup/io_submit/io_getevents).
 *
 * Thin, but the one place that knows io_submit's quirks: it may accept
 * only some of a batch, fail with EAGAIN when the kernel is short of
 * resources, or be interrupted.
 */
#ifndef MLOOP_AIO_RING_H
#define MLOOP_AIO_RING_H

#include <time.h>
#include <libaio.h>

/* Requests one context keeps in flight (--queue-depth, queue-depth=). */
#define MLOOP_QUEUE_DEPTH_DEFAULT  128
#define MLOOP_QUEUE_DEPTH_MAX      4096

struct mloop_aio_ring {
  io_context_t ctx;
  unsigned depth;
};

/* Returns 0, or a negative errno. */
int mloop_aio_ring_init (struct mloop_aio_ring *ring, unsigned depth);
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
