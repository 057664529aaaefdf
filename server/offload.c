/* mloop-server — helper threads for blocking work.  See offload.h. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/eventfd.h>

#include "io_rights.h"
#include "offload.h"

/* Helpers only run fallocate, ioctls and pread/pwrite: a small stack. */
#define OFFLOAD_STACK (256 * 1024)

struct offload {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  struct offload_job *head, *tail;
  bool stopping;
  unsigned threads;
  pthread_t *tids;
};

/* Appends JOB to the queue *HEAD..*TAIL (the caller holds its lock). */
static void
append (struct offload_job **head, struct offload_job **tail,
        struct offload_job *job)
{
  job->next = NULL;
  if (*tail)
    (*tail)->next = job;
  else
    *head = job;
  *tail = job;
}

static void
inbox_put (struct offload_inbox *in, struct offload_job *job)
{
  uint64_t one = 1;

  pthread_mutex_lock (&in->lock);
  append (&in->head, &in->tail, job);
  pthread_mutex_unlock (&in->lock);
  if (write (in->efd, &one, sizeof one) != sizeof one)
    abort ();                   /* an eventfd write cannot fail here */
}

static void *
helper_main (void *arg)
{
  struct offload *o = arg;

  /* This thread does the device's IO: keep it out of reclaim, with no
   * right beyond the open file's when the image is a descriptor's.
   */
  mloop_io_thread ();
  pthread_mutex_lock (&o->lock);
  for (;;) {
    struct offload_job *job = o->head;

    if (job == NULL) {
      if (o->stopping)
        break;
      pthread_cond_wait (&o->wake, &o->lock);
      continue;
    }
    o->head = job->next;
    if (o->head == NULL)
      o->tail = NULL;
    pthread_mutex_unlock (&o->lock);
    job->run (job);
    inbox_put (job->home, job);
    pthread_mutex_lock (&o->lock);
  }
  pthread_mutex_unlock (&o->lock);
  return NULL;
}

struct offload *
offload_start (unsigned threads)
{
  struct offload *o = calloc (1, sizeof *o);
  pthread_attr_t attr;
  unsigned i;
  int r = 0;

  if (o == NULL)
    return NULL;
  o->tids = calloc (threads, sizeof *o->tids);
  if (o->tids == NULL) {
    free (o);
    return NULL;
  }
  pthread_mutex_init (&o->lock, NULL);
  pthread_cond_init (&o->wake, NULL);
  pthread_attr_init (&attr);
  pthread_attr_setstacksize (&attr, OFFLOAD_STACK);
  for (i = 0; i < threads && r == 0; i++) {
    r = pthread_create (&o->tids[i], &attr, helper_main, o);
    if (r == 0)
      o->threads++;
  }
  pthread_attr_destroy (&attr);
  if (r != 0) {
    offload_stop (o);
    errno = r;
    return NULL;
  }
  return o;
}

void
offload_stop (struct offload *o)
{
  unsigned i;

  if (o == NULL)
    return;
  pthread_mutex_lock (&o->lock);
  o->stopping = true;
  pthread_cond_broadcast (&o->wake);
  pthread_mutex_unlock (&o->lock);
  for (i = 0; i < o->threads; i++)
    pthread_join (o->tids[i], NULL);
  pthread_cond_destroy (&o->wake);
  pthread_mutex_destroy (&o->lock);
  free (o->tids);
  free (o);
}

void
offload_submit (struct offload *o, struct offload_job *job)
{
  pthread_mutex_lock (&o->lock);
  append (&o->head, &o->tail, job);
  pthread_cond_signal (&o->wake);
  pthread_mutex_unlock (&o->lock);
}

int
offload_inbox_init (struct offload_inbox *in)
{
  in->head = in->tail = NULL;
  in->efd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (in->efd == -1)
    return -1;
  pthread_mutex_init (&in->lock, NULL);
  return 0;
}

void
offload_inbox_destroy (struct offload_inbox *in)
{
  if (in->efd >= 0) {
    close (in->efd);
    pthread_mutex_destroy (&in->lock);
  }
  in->efd = -1;
}

struct offload_job *
offload_inbox_take (struct offload_inbox *in)
{
  struct offload_job *list;
  uint64_t count;

  /* Reset the counter first: a job finishing meanwhile signals again. */
  if (read (in->efd, &count, sizeof count) == -1 && errno != EAGAIN)
    return NULL;
  pthread_mutex_lock (&in->lock);
  list = in->head;
  in->head = in->tail = NULL;
  pthread_mutex_unlock (&in->lock);
  return list;
}
