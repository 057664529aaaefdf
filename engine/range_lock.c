/* mloop — a lock over byte ranges of the backing store. */
#include <stdbool.h>
#include <stddef.h>

#include "range_lock.h"

void
mloop_range_lock_init (struct mloop_range_lock *l)
{
  pthread_mutex_init (&l->mutex, NULL);
  pthread_cond_init (&l->released, NULL);
  l->held = NULL;
}

void
mloop_range_lock_destroy (struct mloop_range_lock *l)
{
  pthread_cond_destroy (&l->released);
  pthread_mutex_destroy (&l->mutex);
}

static bool
overlaps_held (const struct mloop_range_lock *l, uint64_t start, uint64_t end)
{
  const struct mloop_range *r;

  for (r = l->held; r; r = r->next)
    if (start < r->end && r->start < end)
      return true;
  return false;
}

void
mloop_range_lock (struct mloop_range_lock *l, struct mloop_range *r,
                  uint64_t start, uint64_t end)
{
  pthread_mutex_lock (&l->mutex);
  while (overlaps_held (l, start, end))
    pthread_cond_wait (&l->released, &l->mutex);
  r->start = start;
  r->end = end;
  r->next = l->held;
  l->held = r;
  pthread_mutex_unlock (&l->mutex);
}

void
mloop_range_unlock (struct mloop_range_lock *l, struct mloop_range *r)
{
  struct mloop_range **p;

  pthread_mutex_lock (&l->mutex);
  for (p = &l->held; *p; p = &(*p)->next)
    if (*p == r) {
      *p = r->next;
      break;
    }
  pthread_cond_broadcast (&l->released);
  pthread_mutex_unlock (&l->mutex);
}
