/* mloop-server — a worker's event loop: the epoll set, the inbox of new
 * connections, and stopping with its drain deadline.  What happens on a
 * connection is conn.c's, what happens to a request on its way through
 * the engine is dispatch.c's: this file decides only what runs in each
 * round of the loop, and when the loop sleeps.  See worker.h for the
 * model.
 */
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include "clock.h"
#include "conn.h"
#include "dispatch.h"
#include "io_rights.h"
#include "trace.h"
#include "worker.h"

/* epoll events taken per epoll_wait. */
#define EPOLL_BATCH 64
/* How often a connection waiting for the server's budget looks again:
 * other workers free it without telling us, and waiting is rare.
 */
#define BUDGET_RETRY_MS 10
/* How long a worker that used the heap waits idle before giving its
 * free memory back to the kernel.
 */
#define IDLE_TRIM_MS 5000
/* Room for new connections in the inbox when it is first needed. */
#define INBOX_FIRST_CAP 16

struct worker {
  struct worker_options opts;
  pthread_t thread;
  int epfd;
  int inbox_efd;                /* new connections, or stop */

  pthread_mutex_t inbox_lock;   /* guards the inbox */
  struct arrival {
    int fd;
    struct session session;
  } *inbox;
  size_t inbox_len, inbox_cap;
  atomic_bool stopping;

  struct dispatch dispatch;     /* requests on their way through the
                                   engine */
  struct conn_set conns;        /* the connections this worker serves */
};

/* epoll data for the worker's own descriptors (connections use their
 * struct conn pointer).
 */
static char aio_tag, inbox_tag, done_tag;

static void
take_inbox (struct worker *w)
{
  uint64_t v;
  size_t i;

  if (read (w->inbox_efd, &v, sizeof v) == -1 && errno != EAGAIN)
    return;
  pthread_mutex_lock (&w->inbox_lock);
  for (i = 0; i < w->inbox_len; i++)
    conn_adopt (&w->conns, w->inbox[i].fd, &w->inbox[i].session);
  w->inbox_len = 0;
  pthread_mutex_unlock (&w->inbox_lock);
}

/* At the drain deadline: replies still unsent (their client does not
 * read them) are dropped, so the worker can close and exit.  IO still in
 * the kernel or with a helper is waited for, since it uses our buffers.
 */
static void
drop_unsent_replies (struct worker *w)
{
  unsigned dropped = conn_set_break_all (&w->conns);

  if (dropped)
    fprintf (stderr, "mloop-server: drain timeout (%u s): dropping the "
             "replies of %u connection(s)\n", w->opts.drain_timeout, dropped);
}

/* Gives the heap's free memory back to the kernel, once the buffers a
 * worker's connections used are freed and it has nothing to do: when
 * its last connection has closed, or after IDLE_TRIM_MS without an
 * event (then the buffers its connections kept for their next requests
 * go too: an idle device, of a thousand in one mloopd, holds none).  main.c keeps freed request buffers in the heap for reuse
 * (keep_request_buffers); glibc gives back by itself only the top of a
 * heap past M_TRIM_THRESHOLD, never the free pages inside it, so without
 * this 500 clients that had each read 8 MiB left the server at 1.9 GiB
 * resident with none connected.  malloc_trim(0) releases those free
 * pages in every thread's heap.
 */
/* Under AddressSanitizer the sanitizer's allocator serves every malloc:
 * glibc's heap stays empty and uninitialised, and glibc's malloc_trim
 * (which ASan does not replace, as valgrind does) would initialise it
 * from whichever workers idle first, unlocked, at the same moment: seen
 * crashing in mtrim one run in thirty.  There is nothing to give back. */
#if defined(__SANITIZE_ADDRESS__)
#define HEAP_IS_SANITIZERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAP_IS_SANITIZERS 1
#endif
#endif

static void
release_free_heap_pages (void)
{
#ifndef HEAP_IS_SANITIZERS
  malloc_trim (0);
#endif
}

static void
trim_heap_if_idle (struct worker *w, bool timed_out)
{
  if (!w->conns.heap_used || conn_set_has_work (&w->conns) ||
      w->conns.budget_waiters)
    return;
  if (w->conns.all != NULL && !timed_out)
    return;
  w->conns.heap_used = false;
  conn_set_free_returned (&w->conns);
  conn_set_free_kept (&w->conns);
  release_free_heap_pages ();
}

/* How long epoll_wait may sleep, in ms (-1: until something happens). */
static int
epoll_timeout_ms (const struct worker *w, bool shutdown_seen, bool drained,
                  int64_t deadline)
{
  int ms = -1;

  if (conn_set_has_work (&w->conns))
    return 0;                   /* never sleep with work in hand */
  if (w->conns.heap_used)
    ms = IDLE_TRIM_MS;
  if (w->conns.budget_waiters)
    ms = BUDGET_RETRY_MS;
  if (shutdown_seen && !drained) {
    int64_t left = deadline - server_now_ms ();

    if (left < 0)
      left = 0;
    if (ms == -1 || left < ms)
      ms = (int) left;
  }
  return ms;
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct epoll_event evs[EPOLL_BATCH];
  bool shutdown_seen = false, drained = false;
  int64_t deadline = 0;

  /* This thread does the device's IO: keep it out of reclaim, with no
   * right beyond the open file's when the image is a descriptor's.
   */
  mloop_io_thread ();

  for (;;) {
    int n, i;
    bool completions = false;

    mloop_trace_flush ();
    n = epoll_wait (w->epfd, evs, EPOLL_BATCH,
                    epoll_timeout_ms (w, shutdown_seen, drained, deadline));
    if (n == -1 && errno != EINTR)
      break;
    if (n == -1)
      n = 0;
    conn_set_read_ready (&w->conns);
    for (i = 0; i < n; i++) {
      void *tag = evs[i].data.ptr;

      if (tag == &aio_tag)
        completions = true;
      else if (tag == &inbox_tag)
        take_inbox (w);
      else if (tag == &done_tag)
        dispatch_take_done (&w->dispatch);
      else
        conn_handle_events (tag, evs[i].events);
    }
    if (atomic_load (&w->stopping) && !shutdown_seen) {
      shutdown_seen = true;
      deadline = server_now_ms () + (int64_t) w->opts.drain_timeout * 1000;
      conn_set_refuse_buffered (&w->conns);
    }
    if (shutdown_seen && !drained && server_now_ms () >= deadline) {
      drained = true;
      drop_unsent_replies (w);
    }
    /* One io_submit for everything this round read. */
    dispatch_submit (&w->dispatch);
    if (completions) {
      dispatch_reap (&w->dispatch);
      /* Ring room may have freed up for connections paused on it. */
      conn_set_resume_for_ring (&w->conns);
    }
    conn_set_retry_budget (&w->conns);
    /* One sendmsg per connection for all its finished replies. */
    conn_set_flush (&w->conns);
    conn_set_free_closed (&w->conns);
    if (shutdown_seen && w->conns.all == NULL && dispatch_idle (&w->dispatch))
      break;
    trim_heap_if_idle (w, n == 0);
  }
  /* Here, not in worker_stop: io_destroy waits for an RCU grace period
   * (tens of ms under emulation), and the workers stopped together wait
   * for theirs at once rather than one after another.
   */
  dispatch_close_rings (&w->dispatch);
  return NULL;
}

/* ------------------------------------------------------------ public */

static int
epoll_add_tag (int epfd, int fd, void *tag)
{
  struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tag };

  return epoll_ctl (epfd, EPOLL_CTL_ADD, fd, &ev);
}

struct worker *
worker_start (const struct worker_options *opts, char *err, size_t errlen)
{
  struct worker *w = calloc (1, sizeof *w);
  bool dispatch_open = false;
  int r;

  if (w == NULL) {
    snprintf (err, errlen, "worker: %s", strerror (errno));
    return NULL;
  }
  w->opts = *opts;
  pthread_mutex_init (&w->inbox_lock, NULL);
  atomic_init (&w->stopping, false);
  w->epfd = epoll_create1 (EPOLL_CLOEXEC);
  w->inbox_efd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->epfd == -1 || w->inbox_efd == -1)
    goto errno_fail;
  if (dispatch_init (&w->dispatch, opts->engine, opts->offload,
                     opts->offload_tenant, opts->ring_depth) == -1)
    goto errno_fail;
  dispatch_open = true;
  if (epoll_add_tag (w->epfd, w->dispatch.aio_efd, &aio_tag) == -1 ||
      epoll_add_tag (w->epfd, w->inbox_efd, &inbox_tag) == -1 ||
      epoll_add_tag (w->epfd, w->dispatch.done.efd, &done_tag) == -1)
    goto errno_fail;
  w->conns = (struct conn_set) {
    .opts = &w->opts,
    .epfd = w->epfd,
    .stopping = &w->stopping,
    .dispatch = &w->dispatch,
  };
  r = pthread_create (&w->thread, NULL, worker_main, w);
  if (r != 0) {
    errno = r;
    goto errno_fail;
  }
  return w;

 errno_fail:
  snprintf (err, errlen, "starting a worker: %s", strerror (errno));
  if (dispatch_open)
    dispatch_destroy (&w->dispatch);
  if (w->epfd >= 0) close (w->epfd);
  if (w->inbox_efd >= 0) close (w->inbox_efd);
  free (w);
  return NULL;
}

static void
poke (struct worker *w)
{
  uint64_t one = 1;

  if (write (w->inbox_efd, &one, sizeof one) != sizeof one)
    abort ();                   /* an eventfd write cannot fail here */
}

void
worker_close_client (const struct worker_options *opts, int fd)
{
  if (opts->close_client)
    opts->close_client (fd);
  else
    close (fd);
}

void
worker_add_connection (struct worker *w, int fd,
                       const struct session *session)
{
  pthread_mutex_lock (&w->inbox_lock);
  if (w->inbox_len == w->inbox_cap) {
    size_t cap = w->inbox_cap ? 2 * w->inbox_cap : INBOX_FIRST_CAP;
    struct arrival *p = realloc (w->inbox, cap * sizeof *p);

    if (p == NULL) {
      pthread_mutex_unlock (&w->inbox_lock);
      transport_close_copy (&session->transport);
      worker_close_client (&w->opts, fd);
      return;
    }
    w->inbox = p;
    w->inbox_cap = cap;
  }
  w->inbox[w->inbox_len++] = (struct arrival) { fd, *session };
  pthread_mutex_unlock (&w->inbox_lock);
  poke (w);
}

void
worker_begin_stop (struct worker *w)
{
  if (!atomic_exchange (&w->stopping, true))
    poke (w);
}

void
worker_stop (struct worker *w)
{
  size_t i;

  worker_begin_stop (w);
  pthread_join (w->thread, NULL);
  for (i = 0; i < w->inbox_len; i++) {
    transport_close (&w->inbox[i].session.transport);
    worker_close_client (&w->opts, w->inbox[i].fd);
  }
  free (w->inbox);
  dispatch_destroy (&w->dispatch);
  close (w->epfd);
  close (w->inbox_efd);
  pthread_mutex_destroy (&w->inbox_lock);
  free (w);
}
