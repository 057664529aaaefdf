/* mloop — the plugin's pool of AIO rings.  See aio_pool.h for the two
 * modes.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "aio_ring.h"
#include "io_rights.h"
#include "aio_pool.h"

/* Completions reaped per io_getevents call. */
enum { REAP_BATCH = 64 };

struct pool_ring {
  struct mloop_aio_pool *pool;
  struct mloop_aio_ring ring;
  /* Free submission slots: queue_depth minus requests in flight. */
  sem_t slots;
  bool sem_ready;
  atomic_uint in_flight;

  /* REAPER_THREADS mode.  The stop eventfd is watched by an IOCB_CMD_POLL
   * request on the ring itself, so writing to it wakes io_getevents
   * without a timeout or a signal.
   */
  pthread_t thread;
  bool thread_started;
  int stop_fd;
  struct iocb stop_iocb;
  atomic_bool stopping;

  /* CALLER_REAPS mode: who reaps, and who sleeps waiting for a turn. */
  pthread_mutex_t lock;
  bool reaping;
  struct mloop_pool_waiter *followers;
};

struct mloop_aio_pool {
  enum mloop_pool_mode mode;
  unsigned n;
  unsigned queue_depth;
  bool limited;                 /* fs.aio-max-nr made a ring smaller */
  mloop_pool_event_fn on_event;
  void *opaque;
  atomic_uint next;             /* round-robin cursor */
  struct pool_ring *rings;
};

void
mloop_pool_waiter_init (struct mloop_pool_waiter *w)
{
  sem_init (&w->wake, 0, 0);
  atomic_init (&w->done, false);
  w->queued = false;
  w->next = NULL;
}

void
mloop_pool_waiter_done (struct mloop_pool_waiter *w)
{
  atomic_store (&w->done, true);
  sem_post (&w->wake);
}

void
mloop_pool_waiter_wait (struct mloop_pool_waiter *w)
{
  while (!atomic_load (&w->done))
    sem_wait (&w->wake);        /* EINTR: look again */
}

void
mloop_pool_waiter_destroy (struct mloop_pool_waiter *w)
{
  sem_destroy (&w->wake);
}

static void
release_slot (struct pool_ring *w)
{
  atomic_fetch_sub (&w->in_flight, 1);
  sem_post (&w->slots);
}

/* Resubmits a request after a short transfer.  If the kernel refuses it,
 * the request is finished with that error through the event handler.
 */
static void
resubmit (struct pool_ring *w, struct mloop_io *io)
{
  struct iocb *iocb = &io->iocb;
  int r;

  for (;;) {
    r = mloop_aio_ring_submit (&w->ring, &iocb, 1);
    if (r == 1)
      return;
    if (w->pool->on_event (w->pool->opaque, io, r < 0 ? r : -EIO)
        == MLOOP_EVENT_DONE) {
      release_slot (w);
      return;
    }
  }
}

/* Hands N reaped events to the event handler. */
static void
dispatch (struct pool_ring *w, struct io_event *events, int n)
{
  struct mloop_aio_pool *pool = w->pool;
  int i;

  for (i = 0; i < n; i++) {
    struct mloop_io *io;

    if (events[i].obj == &w->stop_iocb)
      continue;                 /* 'stopping' is already set */
    io = events[i].data;
    switch (pool->on_event (pool->opaque, io, (long) events[i].res)) {
    case MLOOP_EVENT_DONE:
      release_slot (w);
      break;
    case MLOOP_EVENT_RESUBMIT:
      resubmit (w, io);
      break;
    }
  }
}

static void *
reaper_thread (void *arg)
{
  struct pool_ring *w = arg;
  struct io_event events[REAP_BATCH];

  mloop_io_thread ();

  while (!(atomic_load (&w->stopping) && atomic_load (&w->in_flight) == 0)) {
    int n = mloop_aio_ring_reap (&w->ring, 1, events, REAP_BATCH, NULL);

    if (n > 0)
      dispatch (w, events, n);
  }
  return NULL;
}

static int
start_reaper_thread (struct pool_ring *w)
{
  struct iocb *iocb = &w->stop_iocb;
  int r;

  w->stop_fd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->stop_fd == -1)
    return -errno;
  io_prep_poll (iocb, w->stop_fd, POLLIN);
  r = mloop_aio_ring_submit (&w->ring, &iocb, 1);
  if (r != 1)
    return r < 0 ? r : -EIO;    /* needs Linux ≥ 4.18 (IOCB_CMD_POLL) */
  r = pthread_create (&w->thread, NULL, reaper_thread, w);
  if (r != 0)
    return -r;
  w->thread_started = true;
  return 0;
}

static int
ring_init (struct pool_ring *w, struct mloop_aio_pool *pool)
{
  bool limited;
  int r;

  w->pool = pool;
  w->stop_fd = -1;
  atomic_init (&w->in_flight, 0);
  atomic_init (&w->stopping, false);
  pthread_mutex_init (&w->lock, NULL);
  /* One extra ring entry for the stop poll.  Short of fs.aio-max-nr, a
   * smaller ring: its semaphore then lets fewer requests in.
   */
  r = mloop_aio_ring_init_fit (&w->ring, pool->queue_depth + 1,
                               MLOOP_AIO_RING_FLOOR, &limited);
  if (limited)
    pool->limited = true;
  if (r < 0)
    return r;
  if (sem_init (&w->slots, 0, (unsigned) r - 1) == -1)
    return -errno;
  w->sem_ready = true;
  if (pool->mode == MLOOP_POOL_REAPER_THREADS)
    return start_reaper_thread (w);
  return 0;
}

static void
ring_stop (struct pool_ring *w)
{
  if (w->thread_started) {
    uint64_t one = 1;

    atomic_store (&w->stopping, true);
    if (write (w->stop_fd, &one, sizeof one) != sizeof one)
      abort ();                 /* an eventfd write cannot fail here */
    pthread_join (w->thread, NULL);
    w->thread_started = false;
  }
  mloop_aio_ring_destroy (&w->ring);
  if (w->stop_fd >= 0)
    close (w->stop_fd);
  w->stop_fd = -1;
  if (w->sem_ready)
    sem_destroy (&w->slots);
  pthread_mutex_destroy (&w->lock);
}

struct mloop_aio_pool *
mloop_aio_pool_start (enum mloop_pool_mode mode, unsigned threads,
                         unsigned queue_depth, mloop_pool_event_fn on_event,
                         void *opaque)
{
  struct mloop_aio_pool *pool;
  unsigned i;
  int r;

  if (threads == 0 || queue_depth == 0) {
    errno = EINVAL;
    return NULL;
  }
  pool = calloc (1, sizeof *pool);
  if (pool == NULL)
    return NULL;
  pool->mode = mode;
  pool->queue_depth = queue_depth;
  pool->on_event = on_event;
  pool->opaque = opaque;
  atomic_init (&pool->next, 0);
  pool->rings = calloc (threads, sizeof *pool->rings);
  if (pool->rings == NULL) {
    free (pool);
    return NULL;
  }
  for (i = 0; i < threads; i++) {
    pool->n = i + 1;
    r = ring_init (&pool->rings[i], pool);
    if (r == -EAGAIN && i > 0) {
      /* Short of fs.aio-max-nr even for the floor: the rings there are
       * serve (their semaphores make the callers take turns).
       */
      ring_stop (&pool->rings[i]);
      pool->n = i;
      pool->limited = true;
      break;
    }
    if (r < 0) {
      mloop_aio_pool_stop (pool);
      errno = -r;
      return NULL;
    }
  }
  return pool;
}

/* Picks a ring with a free slot, starting from the round-robin cursor
 * so load spreads evenly; waits on the first one only when all are full.
 */
static struct pool_ring *
acquire_ring (struct mloop_aio_pool *pool)
{
  unsigned start = atomic_fetch_add (&pool->next, 1);
  unsigned i;
  struct pool_ring *w;

  for (i = 0; i < pool->n; i++) {
    w = &pool->rings[(start + i) % pool->n];
    if (sem_trywait (&w->slots) == 0)
      return w;
  }
  w = &pool->rings[start % pool->n];
  while (sem_wait (&w->slots) == -1)
    ;                           /* EINTR */
  return w;
}

static int
submit_to (struct pool_ring *w, struct mloop_io *io)
{
  struct iocb *iocb = &io->iocb;
  int r;

  atomic_fetch_add (&w->in_flight, 1);
  r = mloop_aio_ring_submit (&w->ring, &iocb, 1);
  if (r == 1)
    return 0;
  release_slot (w);
  return r < 0 ? r : -EIO;
}

int
mloop_aio_pool_submit (struct mloop_aio_pool *pool, struct mloop_io *io)
{
  if (pool->mode != MLOOP_POOL_REAPER_THREADS)
    return -EINVAL;             /* nobody would reap it */
  return submit_to (acquire_ring (pool), io);
}

static void
remove_follower (struct pool_ring *w, struct mloop_pool_waiter *me)
{
  struct mloop_pool_waiter **p;

  if (!me->queued)
    return;
  for (p = &w->followers; *p; p = &(*p)->next)
    if (*p == me) {
      *p = me->next;
      break;
    }
  me->queued = false;
}

/* The leader/follower loop.  Invariant, under w->lock: while anyone is on
 * the follower list, either 'reaping' is set or a follower has just been
 * woken to take the role — so a request can never be left unreaped with
 * its thread asleep.
 */
int
mloop_aio_pool_submit_and_wait (struct mloop_aio_pool *pool,
                                   struct mloop_io *io,
                                   struct mloop_pool_waiter *me)
{
  struct pool_ring *w;
  struct io_event events[REAP_BATCH];
  int r;

  if (pool->mode == MLOOP_POOL_REAPER_THREADS) {
    /* The completion is the only post: waiting for it (not for 'done')
     * means the reaper has finished touching the waiter before the caller
     * may destroy it.
     */
    r = mloop_aio_pool_submit (pool, io);
    if (r == 0)
      while (sem_wait (&me->wake) == -1)
        ;                       /* EINTR */
    return r;
  }

  w = acquire_ring (pool);
  r = submit_to (w, io);
  if (r < 0)
    return r;

  pthread_mutex_lock (&w->lock);
  while (!atomic_load (&me->done)) {
    if (!w->reaping) {
      int n;

      w->reaping = true;
      pthread_mutex_unlock (&w->lock);
      n = mloop_aio_ring_reap (&w->ring, 1, events, REAP_BATCH, NULL);
      pthread_mutex_lock (&w->lock);
      /* Completions run under the lock.  A waiter reads its 'done' under
       * the lock too, so it cannot see 'done' and destroy its waiter (a
       * stack variable) while the completion is still posting to it:
       * that stray sem_post would land in whatever the stack holds next.
       */
      if (n > 0)
        dispatch (w, events, n);
      w->reaping = false;
      continue;
    }
    me->queued = true;
    me->next = w->followers;
    w->followers = me;
    pthread_mutex_unlock (&w->lock);
    while (sem_wait (&me->wake) == -1)
      ;                         /* EINTR */
    pthread_mutex_lock (&w->lock);
    remove_follower (w, me);
  }
  /* Leaving: if nobody is reaping, pass the role to a follower. */
  if (!w->reaping && w->followers) {
    struct mloop_pool_waiter *next = w->followers;

    w->followers = next->next;
    next->queued = false;
    sem_post (&next->wake);
  }
  pthread_mutex_unlock (&w->lock);
  return 0;
}

bool
mloop_aio_pool_limited (const struct mloop_aio_pool *pool)
{
  return pool->limited;
}

void
mloop_aio_pool_stop (struct mloop_aio_pool *pool)
{
  unsigned i;

  if (pool == NULL)
    return;
  for (i = 0; i < pool->n; i++)
    ring_stop (&pool->rings[i]);
  free (pool->rings);
  free (pool);
}
