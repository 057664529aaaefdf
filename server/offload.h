/* mloop-server — helper threads for what has no asynchronous form.
 *
 * TRIM and WRITE_ZEROES (fallocate, BLKDISCARD, BLKZEROOUT), the
 * read-modify-write of unaligned requests and the page-cache tail of an
 * odd-sized image block their thread for as long as the disk takes: a
 * whole-device discard can take seconds.  Run on an event loop, they
 * would stall every connection of that loop, so a loop hands them to this
 * pool and goes on; each job comes back to its loop's inbox, whose
 * eventfd the loop watches, and the loop replies from there.  A job never
 * touches its connection: the loop owns that.
 *
 * Ordering: a job's reply is sent only after it has run, so every rule of
 * docs/design.md holds (a FLUSH covers what was replied to; a zero is
 * never lost behind an acknowledged write).  Requests in flight together
 * are, as NBD allows, not ordered among themselves.
 */
#ifndef MLOOP_SERVER_OFFLOAD_H
#define MLOOP_SERVER_OFFLOAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define OFFLOAD_THREADS_DEFAULT 4
#define OFFLOAD_THREADS_MAX     64

struct offload_job;
typedef void (*offload_run_fn) (struct offload_job *job);

/* Where finished jobs go: one per event loop. */
struct offload_inbox {
  pthread_mutex_t lock;
  struct offload_job *head, *tail;
  int efd;                      /* written once per finished job */
};

/* Whose jobs they are: one served image's (all its workers').  A pool
 * runs at most its per-tenant cap of one tenant's jobs at once and
 * takes tenants in turn, so that in a process serving many images
 * (mloopd) an image whose disk stalls holds a few helpers, never every
 * one, and its queued jobs never wait in front of another image's.
 * Zeroed before use; the pool's lock guards it.
 */
struct offload_tenant {
  unsigned running;             /* its jobs on helpers now */
  struct offload_job *head, *tail;      /* its jobs waiting */
  bool ready;                   /* in the pool's list of tenants to serve */
  struct offload_tenant *next;
};

struct offload_job {
  offload_run_fn run;           /* on a helper; may block */
  struct offload_inbox *home;
  struct offload_tenant *tenant;        /* NULL: the pool's own */
  struct offload_job *next;
};

struct offload;

/* Starts THREADS helpers, which run any tenant's jobs up to THREADS at
 * once (a server of one image).  Returns NULL with errno set on failure.
 */
struct offload *offload_start (unsigned threads);
/* Starts THREADS helpers for many tenants: a job that finds none idle
 * starts another, up to MAX_THREADS, and a tenant runs at most
 * PER_TENANT jobs at once.
 */
struct offload *offload_start_shared (unsigned threads, unsigned max_threads,
                                      unsigned per_tenant);
/* Runs what is queued, then stops and frees the helpers. */
void offload_stop (struct offload *o);

/* Queues JOB; JOB->run runs on a helper, then JOB goes to JOB->home. */
void offload_submit (struct offload *o, struct offload_job *job);

int offload_inbox_init (struct offload_inbox *in);
void offload_inbox_destroy (struct offload_inbox *in);
/* Takes every finished job, oldest first (NULL if none). */
struct offload_job *offload_inbox_take (struct offload_inbox *in);

#endif /* MLOOP_SERVER_OFFLOAD_H */
