/* A device's server inside a process that holds many (hosted_server.h). */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "budget.h"
#include "handshake.h"
#include "hosted_server.h"
#include "listener.h"
#include "offload.h"
#include "served_image.h"
#include "splice_out.h"
#include "stats.h"

/* mloop-server's defaults (server/main.c), which a device's server runs
 * with.
 */
#define HOSTED_QUEUE_DEPTH 1024
#define HOSTED_DRAIN_TIMEOUT_S 5

/* A connection negotiating, on the process's list of them (watch). */
struct negotiation {
  int fd;
  struct timespec deadline;
  struct negotiation *next;
};

struct hosted_server {
  struct served_image image;
  struct listener listener;
  struct mloop_stats *stats;
  int stop_efd;                 /* written to end the accept thread */
  pthread_t acceptor;
  struct negotiation negotiating;       /* on watch's list, or fd -1 */
  bool closing;                 /* under watch.lock */
};

/* The handshake's own timeouts bound each read, not the whole: a client
 * sending an option every few seconds would keep a server's accept
 * thread, and the close that waits for it, for ever.  So each
 * connection negotiating is on this list until it is done, and one
 * timer for the process (its thread, SIGEV_THREAD) shuts down those
 * whose time is up.  The list and timer live as long as the process:
 * an expiry late by a little touches nothing freed.
 */
static struct {
  pthread_mutex_t lock;
  struct negotiation *list;
  timer_t timer;
} watch = { .lock = PTHREAD_MUTEX_INITIALIZER };

static bool
passed (const struct timespec *deadline, const struct timespec *now)
{
  return now->tv_sec > deadline->tv_sec ||
    (now->tv_sec == deadline->tv_sec && now->tv_nsec >= deadline->tv_nsec);
}

/* Arms the timer for the earliest deadline on the list, or disarms it.
 * Called with watch.lock held.
 */
static void
watch_arm (void)
{
  struct itimerspec t = { { 0, 0 }, { 0, 0 } };

  for (struct negotiation *n = watch.list; n; n = n->next)
    if ((t.it_value.tv_sec == 0 && t.it_value.tv_nsec == 0) ||
        passed (&n->deadline, &t.it_value))
      t.it_value = n->deadline;
  timer_settime (watch.timer, TIMER_ABSTIME, &t, NULL);
}

static void
watch_expired (union sigval unused)
{
  struct timespec now;

  (void) unused;
  clock_gettime (CLOCK_MONOTONIC, &now);
  pthread_mutex_lock (&watch.lock);
  /* Each shut down once, and off the list: its handshake fails now. */
  for (struct negotiation **p = &watch.list; *p; )
    if (passed (&(*p)->deadline, &now)) {
      shutdown ((*p)->fd, SHUT_RDWR);
      *p = (*p)->next;
    }
    else
      p = &(*p)->next;
  watch_arm ();
  pthread_mutex_unlock (&watch.lock);
}

/* What every hosted server of the process shares: made with the first
 * and kept for the process's life, since a process that hosts servers
 * hosts them for its life, and one device attached and detached at a
 * time would otherwise start and stop the helper threads each time.
 */
static struct {
  pthread_mutex_t lock;
  bool made;
  struct budget budget;
  struct offload *offload;
  bool splice;                  /* splice_out_works(), asked once */
} shared = { .lock = PTHREAD_MUTEX_INITIALIZER };

static int
shared_make (char *err, size_t errlen)
{
  int r = 0;

  pthread_mutex_lock (&shared.lock);
  if (!shared.made) {
    budget_init (&shared.budget, BUDGET_SERVER_DEFAULT, BUDGET_CONN_DEFAULT);
    /* A helper blocked on one image's stalled disk is not another's:
     * each image runs as many jobs at once as a server of its own would
     * (OFFLOAD_THREADS_DEFAULT), and the pool grows while every helper
     * is busy.
     */
    shared.offload = offload_start_shared (OFFLOAD_THREADS_DEFAULT,
                                           OFFLOAD_THREADS_MAX,
                                           OFFLOAD_THREADS_DEFAULT);
    if (shared.offload == NULL) {
      snprintf (err, errlen, "starting %d helper threads: %s",
                OFFLOAD_THREADS_DEFAULT, strerror (errno));
      r = -1;
    }
    else {
      struct sigevent ev = {
        .sigev_notify = SIGEV_THREAD, .sigev_notify_function = watch_expired,
      };

      if (timer_create (CLOCK_MONOTONIC, &ev, &watch.timer) == -1) {
        snprintf (err, errlen, "timer_create: %s", strerror (errno));
        offload_stop (shared.offload);
        shared.offload = NULL;
        r = -1;
      }
      else {
        shared.splice = splice_out_works ();
        shared.made = true;
      }
    }
  }
  pthread_mutex_unlock (&shared.lock);
  return r;
}

static void
set_timeouts (int fd, unsigned seconds)
{
  struct timeval tv = { .tv_sec = seconds };

  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* FD of H begins negotiating, on the list with its deadline; false
 * (not on it) when H is closing.
 */
static bool
watch_begin (struct hosted_server *h, int fd)
{
  bool go;

  pthread_mutex_lock (&watch.lock);
  go = !h->closing;
  if (go) {
    h->negotiating.fd = fd;
    clock_gettime (CLOCK_MONOTONIC, &h->negotiating.deadline);
    h->negotiating.deadline.tv_sec += HOSTED_HANDSHAKE_TIMEOUT_S;
    h->negotiating.next = watch.list;
    watch.list = &h->negotiating;
    if (h->negotiating.next == NULL)
      watch_arm ();
  }
  pthread_mutex_unlock (&watch.lock);
  return go;
}

/* H's connection is done negotiating: off the list, if the timer has
 * not taken it off.
 */
static void
watch_end (struct hosted_server *h)
{
  pthread_mutex_lock (&watch.lock);
  for (struct negotiation **p = &watch.list; *p; p = &(*p)->next)
    if (*p == &h->negotiating) {
      *p = h->negotiating.next;
      break;
    }
  h->negotiating.fd = -1;
  pthread_mutex_unlock (&watch.lock);
}

/* Negotiates one connection, within the handshake timeout, and hands it
 * to a worker.
 */
static void
negotiate (struct hosted_server *h, int fd)
{
  struct export_info x = h->image.export;
  struct session session;
  int r = -1;

  x.size = mloop_engine_size (&h->image.engine);
  set_timeouts (fd, HOSTED_HANDSHAKE_TIMEOUT_S);
  if (watch_begin (h, fd)) {
    r = mloop_handshake (fd, &x, &session);
    watch_end (h);
  }
  if (r == -1) {
    close (fd);
    return;
  }
  set_timeouts (fd, 0);
  served_image_add_connection (&h->image, fd, &session);
}

static void *
accept_loop (void *arg)
{
  struct hosted_server *h = arg;

  for (;;) {
    struct pollfd p[2] = { { h->listener.fd, POLLIN, 0 },
                           { h->stop_efd, POLLIN, 0 } };
    int fd;

    if (poll (p, 2, -1) == -1 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!(p[0].revents & POLLIN))
      continue;
    fd = accept4 (h->listener.fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0)
      negotiate (h, fd);
    else if (errno == EMFILE || errno == ENFILE)
      /* The connection stays queued: rest instead of spinning. */
      poll (NULL, 0, 100);
  }
  return NULL;
}

static void
ignore_warning (const char *line)
{
  (void) line;
}

struct hosted_server *
hosted_server_open (const struct hosted_server_config *c,
                    char *err, size_t errlen)
{
  struct hosted_server *h = calloc (1, sizeof *h);
  struct worker_options wopts;
  char *spec;

  if (h == NULL) {
    snprintf (err, errlen, "out of memory");
    return NULL;
  }
  h->stop_efd = -1;
  h->listener.fd = -1;
  h->negotiating.fd = -1;
  if (shared_make (err, errlen) == -1) {
    free (h);
    return NULL;
  }
  if (served_image_open (&h->image, &c->engine, c->read_only, true,
                         c->warn ? c->warn : ignore_warning,
                         err, errlen) == -1)
    goto fail_shared;
  if (c->stats_file && (h->stats = mloop_stats_create (c->stats_file)) == NULL) {
    snprintf (err, errlen, "%s: %s", c->stats_file, strerror (errno));
    goto fail_image;
  }
  wopts = (struct worker_options) {
    .ring_depth = HOSTED_QUEUE_DEPTH,
    .budget = &shared.budget, .offload = shared.offload,
    .drain_timeout = HOSTED_DRAIN_TIMEOUT_S,
    .splice_replies = shared.splice,
    .stats = h->stats,
  };
  if (served_image_start (&h->image, c->threads ? c->threads
                          : HOSTED_THREADS_DEFAULT, &wopts, err, errlen) == -1)
    goto fail_stats;
  /* A socket left by a server that died (or a service killed) serves
   * nobody: the device's directory is ours.
   */
  unlink (c->socket_path);
  if (asprintf (&spec, "unix:%s", c->socket_path) == -1) {
    snprintf (err, errlen, "out of memory");
    goto fail_workers;
  }
  if (listener_open (&h->listener, spec, err, errlen) == -1) {
    free (spec);
    goto fail_workers;
  }
  free (spec);
  h->stop_efd = eventfd (0, EFD_CLOEXEC);
  if (h->stop_efd == -1 ||
      (errno = pthread_create (&h->acceptor, NULL, accept_loop, h)) != 0) {
    snprintf (err, errlen, "starting the accept thread: %s",
              strerror (errno));
    goto fail_listener;
  }
  return h;

 fail_listener:
  if (h->stop_efd != -1)
    close (h->stop_efd);
  listener_close (&h->listener);
 fail_workers:
  served_image_begin_stop (&h->image);
  served_image_stop (&h->image);
 fail_stats:
  if (h->stats)
    mloop_stats_close (h->stats);
 fail_image:
  served_image_close (&h->image);
 fail_shared:
  free (h);
  return NULL;
}

void
hosted_server_export (struct hosted_server *h, uint64_t *size,
                      uint16_t *flags, uint32_t *min_block,
                      uint32_t *preferred_block, uint32_t *max_block)
{
  const struct export_info *x = &h->image.export;

  *size = mloop_engine_size (&h->image.engine);
  *flags = x->transmission_flags;
  *min_block = x->min_block;
  *preferred_block = x->preferred_block;
  *max_block = x->max_block;
}

int
hosted_server_pair (struct hosted_server *h, unsigned n, int *fds,
                    char *err, size_t errlen)
{
  int ours[64], pair[2];
  unsigned i;

  if (n > sizeof ours / sizeof *ours) {
    snprintf (err, errlen, "%u connections: at most %zu", n,
              sizeof ours / sizeof *ours);
    return -1;
  }
  for (i = 0; i < n; i++) {
    if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) == -1) {
      snprintf (err, errlen, "socketpair: %s", strerror (errno));
      while (i-- > 0) {
        close (ours[i]);
        close (fds[i]);
      }
      return -1;
    }
    ours[i] = pair[0];
    fds[i] = pair[1];
  }
  /* Only once all are made: a worker's connection cannot be taken back. */
  for (i = 0; i < n; i++) {
    const struct session none = { 0 };

    served_image_add_connection (&h->image, ours[i], &none);
  }
  return 0;
}

int
hosted_server_reprobe_size (struct hosted_server *h, char *err,
                            size_t errlen)
{
  return mloop_engine_reprobe_size (&h->image.engine, err, errlen) < 0
    ? -1 : 0;
}

uint64_t
hosted_server_size (struct hosted_server *h)
{
  return mloop_engine_size (&h->image.engine);
}

void
hosted_server_close (struct hosted_server *h)
{
  /* A handshake under way ends now, not at its deadline: the caller
   * (mloopd's main loop) waits for the accept thread.
   */
  pthread_mutex_lock (&watch.lock);
  h->closing = true;
  if (h->negotiating.fd != -1)
    shutdown (h->negotiating.fd, SHUT_RDWR);
  pthread_mutex_unlock (&watch.lock);
  eventfd_write (h->stop_efd, 1);
  pthread_join (h->acceptor, NULL);
  close (h->stop_efd);
  listener_close (&h->listener);
  served_image_begin_stop (&h->image);
  served_image_stop (&h->image);
  if (h->stats)
    mloop_stats_close (h->stats);
  served_image_close (&h->image);
  free (h);
}
