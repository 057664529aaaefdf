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
  struct offload_tenant own;    /* jobs that name no tenant */
  struct offload_tenant *ready, *ready_tail;    /* tenants with a job to
                                                   run, in turn */
  unsigned per_tenant;          /* a tenant's jobs on helpers at most */
  bool stopping;
  unsigned threads, max_threads, idle;
  pthread_t *tids;
  pthread_attr_t attr;
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

/* Puts T in the list of tenants to serve if it has a job waiting and
 * room under the cap (the pool's lock held).
 */
static void
make_ready (struct offload *o, struct offload_tenant *t)
{
  if (t->ready || t->head == NULL || t->running >= o->per_tenant)
    return;
  t->ready = true;
  t->next = NULL;
  if (o->ready_tail)
    o->ready_tail->next = t;
  else
    o->ready = t;
  o->ready_tail = t;
}

/* The next job to run: the first ready tenant's oldest, that tenant
 * then going to the back of the list (the pool's lock held).
 */
static struct offload_job *
next_job (struct offload *o)
{
  struct offload_tenant *t = o->ready;
  struct offload_job *job;

  if (t == NULL)
    return NULL;
  o->ready = t->next;
  if (o->ready == NULL)
    o->ready_tail = NULL;
  t->ready = false;
  job = t->head;
  t->head = job->next;
  if (t->head == NULL)
    t->tail = NULL;
  t->running++;
  make_ready (o, t);
  return job;
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
    struct offload_job *job = next_job (o);
    struct offload_tenant *t;

    if (job == NULL) {
      if (o->stopping)
        break;
      o->idle++;
      pthread_cond_wait (&o->wake, &o->lock);
      o->idle--;
      continue;
    }
    pthread_mutex_unlock (&o->lock);
    job->run (job);
    /* The tenant is counted out before the job goes home: once home,
     * the job's server may stop and free the tenant.
     */
    t = job->tenant ? job->tenant : &o->own;
    pthread_mutex_lock (&o->lock);
    t->running--;
    make_ready (o, t);
    pthread_mutex_unlock (&o->lock);
    inbox_put (job->home, job);
    pthread_mutex_lock (&o->lock);
  }
  pthread_mutex_unlock (&o->lock);
  return NULL;
}

/* Starts one more helper (the pool's lock held, or before any job). */
static int
add_helper (struct offload *o)
{
  int r = pthread_create (&o->tids[o->threads], &o->attr, helper_main, o);

  if (r == 0)
    o->threads++;
  return r;
}

struct offload *
offload_start_shared (unsigned threads, unsigned max_threads,
                      unsigned per_tenant)
{
  struct offload *o = calloc (1, sizeof *o);
  int r = 0;

  if (o == NULL)
    return NULL;
  o->max_threads = max_threads > threads ? max_threads : threads;
  o->per_tenant = per_tenant ? per_tenant : 1;
  o->tids = calloc (o->max_threads, sizeof *o->tids);
  if (o->tids == NULL) {
    free (o);
    return NULL;
  }
  pthread_mutex_init (&o->lock, NULL);
  pthread_cond_init (&o->wake, NULL);
  pthread_attr_init (&o->attr);
  pthread_attr_setstacksize (&o->attr, OFFLOAD_STACK);
  while (o->threads < threads && r == 0)
    r = add_helper (o);
  if (r != 0) {
    offload_stop (o);
    errno = r;
    return NULL;
  }
  return o;
}

struct offload *
offload_start (unsigned threads)
{
  return offload_start_shared (threads, threads, threads);
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
  /* No job comes after the stop, so no helper is added meanwhile. */
  for (i = 0; i < o->threads; i++)
    pthread_join (o->tids[i], NULL);
  pthread_attr_destroy (&o->attr);
  pthread_cond_destroy (&o->wake);
  pthread_mutex_destroy (&o->lock);
  free (o->tids);
  free (o);
}

void
offload_submit (struct offload *o, struct offload_job *job)
{
  struct offload_tenant *t = job->tenant ? job->tenant : &o->own;

  pthread_mutex_lock (&o->lock);
  append (&t->head, &t->tail, job);
  make_ready (o, t);
  /* Every helper busy (another tenant's stalled disk, say): one more,
   * if the pool may grow; a helper that cannot start leaves the job to
   * the ones there are.
   */
  if (o->ready && o->idle == 0 && o->threads < o->max_threads)
    add_helper (o);
  else
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
