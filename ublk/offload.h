/* mloop-ublk's helper threads: what the engine can only do synchronously
 * (a read-modify-write of a partial block, the page-cache tail of an
 * odd-sized image, fdatasync where AIO has none, trim and zero) runs here
 * instead of on a queue thread, where it would hold up every other
 * request of the queue for as long as the disk takes.
 *
 * A job runs on a helper, then goes back to its queue's inbox and the
 * queue's eventfd is written; the queue thread, woken in its ring, takes
 * the finished jobs and completes them (the engine's completion and the
 * ublk COMMIT must happen on the queue thread: the kernel binds a queue
 * to the task that fetched its tags). */
#ifndef MLOOP_UBLK_OFFLOAD_H
#define MLOOP_UBLK_OFFLOAD_H

#include <pthread.h>

/* Enough that one long job (a whole-device discard can take seconds)
 * leaves others running; idle helpers cost a stack each. */
#define UBLK_HELPERS 4

struct ublk_job;

/* A queue's finished jobs. */
struct ublk_inbox {
  pthread_mutex_t lock;
  struct ublk_job *head;        /* newest first: order does not matter */
  int efd;                      /* the queue's eventfd, written per job */
};

struct ublk_job {
  int (*run) (struct ublk_job *job);    /* on a helper; may block */
  int result;                           /* what run returned */
  struct ublk_inbox *home;
  struct ublk_job *next;
};

struct ublk_offload;

/* THREADS helpers; NULL with errno set on failure. */
struct ublk_offload *ublk_offload_start (unsigned threads);
/* Runs every job queued, then stops the helpers and frees them: after it
 * returns, no helper touches a job or an inbox any more. */
void ublk_offload_stop (struct ublk_offload *o);
void ublk_offload_submit (struct ublk_offload *o, struct ublk_job *job);

/* Takes every finished job of IN (NULL if none). */
struct ublk_job *ublk_inbox_take (struct ublk_inbox *in);

#endif
