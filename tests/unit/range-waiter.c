/* A thread waiting for a range.  See range-waiter.h. */
#include <unistd.h>

#include "range-waiter.h"
#include "unit.h"

static void *
waiter_main (void *arg)
{
  struct range_waiter *w = arg;

  atomic_store (&w->tid, gettid ());
  mloop_range_lock (w->lock, &w->range, w->start, w->end);
  atomic_store (&w->holds, true);
  return NULL;
}

void
range_waiter_start (struct range_waiter *w, struct mloop_range_lock *l,
                    uint64_t start, uint64_t end)
{
  w->lock = l;
  w->start = start;
  w->end = end;
  atomic_store (&w->tid, 0);
  atomic_store (&w->holds, false);
  CHECK (pthread_create (&w->thread, NULL, waiter_main, w) == 0,
         "pthread_create");
}

bool
range_waiter_holds_within (struct range_waiter *w, unsigned ms)
{
  for (unsigned waited = 0; waited < ms; waited++) {
    if (atomic_load (&w->holds))
      return true;
    unit_sleep_ms (1);
  }
  return atomic_load (&w->holds);
}

void
range_waiter_finish (struct range_waiter *w)
{
  pthread_join (w->thread, NULL);
  CHECK (atomic_load (&w->holds), "[%llu, %llu) ended without the lock",
         (unsigned long long) w->start, (unsigned long long) w->end);
  mloop_range_unlock (w->lock, &w->range);
}
