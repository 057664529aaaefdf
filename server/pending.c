/* mloop-server — connections still negotiating.  See pending.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/socket.h>

#include "clock.h"
#include "log_limit.h"
#include "pending.h"

/* A few dozen bytes per connection, the only allocation before its
 * handshake completes besides the socket and the thread.  Only the accept
 * loop allocates and frees them: a handshake thread that called free()
 * would have glibc set up its thread cache, and with it possibly a new
 * malloc arena (64 MiB of address space), for a connection that may
 * never send a byte.
 */
struct pending {
  int fd;
  bool dropped;                 /* shut down by the accept loop */
  uint64_t deadline_ms;         /* CLOCK_MONOTONIC */
  struct pending *prev, *next;  /* on the list while negotiating */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t all_ended = PTHREAD_COND_INITIALIZER;
static unsigned timeout_ms, max_listed;
static struct pending *head, *tail;     /* oldest first */
static struct pending *done;    /* left by their threads, to be freed */
static unsigned listed;         /* on the list: negotiating, not dropped */
static unsigned running;        /* handshake threads started, not ended */
static bool stopping;

static void
unlink_entry (struct pending *p)
{
  if (p->prev)
    p->prev->next = p->next;
  else
    head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  else
    tail = p->prev;
  p->prev = p->next = NULL;
  listed--;
}

/* With the lock held.  Only wakes the thread, which closes the socket. */
static void
drop (struct pending *p)
{
  unlink_entry (p);
  shutdown (p->fd, SHUT_RDWR);
  p->dropped = true;
}

/* With the lock held. */
static void
free_done (void)
{
  while (done) {
    struct pending *p = done;

    done = p->next;
    free (p);
  }
}

void
pending_init (unsigned timeout_s, unsigned max)
{
  timeout_ms = timeout_s * 1000;
  max_listed = max;
}

struct pending *
pending_begin (int fd)
{
  struct pending *p = calloc (1, sizeof *p);
  uint64_t now = (uint64_t) server_now_ms ();

  if (p == NULL)
    return NULL;
  p->fd = fd;
  p->deadline_ms = now + timeout_ms;
  pthread_mutex_lock (&lock);
  free_done ();
  if (listed >= max_listed) {
    drop (head);
    log_limited ("%u handshakes pending (--max-handshakes): dropped the "
                 "oldest", max_listed);
  }
  p->prev = tail;
  if (tail)
    tail->next = p;
  else
    head = p;
  tail = p;
  listed++;
  running++;
  pthread_mutex_unlock (&lock);
  return p;
}

int
pending_fd (const struct pending *p)
{
  return p->fd;
}

void
pending_abandon (struct pending *p)
{
  pthread_mutex_lock (&lock);
  if (!p->dropped)
    unlink_entry (p);
  running--;
  pthread_mutex_unlock (&lock);
  free (p);
}

bool
pending_leave (struct pending *p)
{
  bool ok;

  pthread_mutex_lock (&lock);
  if (!p->dropped)
    unlink_entry (p);
  ok = !p->dropped && !stopping;
  p->next = done;
  done = p;
  pthread_mutex_unlock (&lock);
  return ok;
}

void
pending_end (void)
{
  pthread_mutex_lock (&lock);
  if (--running == 0)
    pthread_cond_broadcast (&all_ended);
  pthread_mutex_unlock (&lock);
}

int
pending_expire (void)
{
  uint64_t now = (uint64_t) server_now_ms ();
  int wait = -1;

  pthread_mutex_lock (&lock);
  free_done ();
  while (head && head->deadline_ms <= now)
    drop (head);
  if (head)
    wait = (int) (head->deadline_ms - now) + 1;
  pthread_mutex_unlock (&lock);
  return wait;
}

void
pending_drain (void)
{
  pthread_mutex_lock (&lock);
  stopping = true;
  while (head)
    drop (head);
  while (running > 0)
    pthread_cond_wait (&all_ended, &lock);
  free_done ();
  pthread_mutex_unlock (&lock);
}
