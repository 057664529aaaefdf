/* mloop-ublk's helper threads: one locked list of queued jobs, a
 * condition variable, and the helpers taking from it. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "offload.h"

struct ublk_offload {
  pthread_mutex_t lock;
  pthread_cond_t more;
  struct ublk_job *head, *tail; /* queued, oldest first */
  bool stopping;
  unsigned threads;
  pthread_t thread[];
};

static void
deliver (struct ublk_job *job)
{
  struct ublk_inbox *in = job->home;
  uint64_t one = 1;

  pthread_mutex_lock (&in->lock);
  job->next = in->head;
  in->head = job;
  pthread_mutex_unlock (&in->lock);
  /* After the job is in the list: the queue's read of efd then finds it.
   * An eventfd write fails only when the counter would overflow, and
   * then the queue has a wake-up pending anyway. */
  while (write (in->efd, &one, sizeof one) < 0 && errno == EINTR)
    ;
}

static void *
helper_main (void *arg)
{
  struct ublk_offload *o = arg;

  pthread_mutex_lock (&o->lock);
  for (;;) {
    while (!o->head && !o->stopping)
      pthread_cond_wait (&o->more, &o->lock);
    struct ublk_job *job = o->head;
    if (!job)
      break;                    /* stopping, and nothing left */
    o->head = job->next;
    if (!o->head)
      o->tail = NULL;
    pthread_mutex_unlock (&o->lock);
    job->result = job->run (job);
    deliver (job);
    pthread_mutex_lock (&o->lock);
  }
  pthread_mutex_unlock (&o->lock);
  return NULL;
}

struct ublk_offload *
ublk_offload_start (unsigned threads)
{
  struct ublk_offload *o = calloc (1, sizeof *o + threads * sizeof (pthread_t));
  if (!o)
    return NULL;
  pthread_mutex_init (&o->lock, NULL);
  pthread_cond_init (&o->more, NULL);
  for (; o->threads < threads; o->threads++) {
    int r = pthread_create (&o->thread[o->threads], NULL, helper_main, o);
    if (r) {
      ublk_offload_stop (o);
      errno = r;
      return NULL;
    }
  }
  return o;
}

void
ublk_offload_stop (struct ublk_offload *o)
{
  pthread_mutex_lock (&o->lock);
  o->stopping = true;
  pthread_cond_broadcast (&o->more);
  pthread_mutex_unlock (&o->lock);
  for (unsigned i = 0; i < o->threads; i++)
    pthread_join (o->thread[i], NULL);
  pthread_cond_destroy (&o->more);
  pthread_mutex_destroy (&o->lock);
  free (o);
}

void
ublk_offload_submit (struct ublk_offload *o, struct ublk_job *job)
{
  job->next = NULL;
  pthread_mutex_lock (&o->lock);
  if (o->tail)
    o->tail->next = job;
  else
    o->head = job;
  o->tail = job;
  pthread_cond_signal (&o->more);
  pthread_mutex_unlock (&o->lock);
}

struct ublk_job *
ublk_inbox_take (struct ublk_inbox *in)
{
  pthread_mutex_lock (&in->lock);
  struct ublk_job *jobs = in->head;
  in->head = NULL;
  pthread_mutex_unlock (&in->lock);
  return jobs;
}
