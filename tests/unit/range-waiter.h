/* A thread that asks for a range of a range lock and says when it has
 * it, for the range lock's unit tests.
 */
#ifndef MLOOP_TESTS_RANGE_WAITER_H
#define MLOOP_TESTS_RANGE_WAITER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "range_lock.h"

struct range_waiter {
  struct mloop_range_lock *lock;
  uint64_t start, end;
  atomic_int tid;               /* its thread id, once it runs */
  atomic_bool holds;            /* set once it holds [start, end) */
  struct mloop_range range;
  pthread_t thread;
};

/* Starts a thread that locks [START, END) of L and holds it. */
void range_waiter_start (struct range_waiter *w, struct mloop_range_lock *l,
                         uint64_t start, uint64_t end);
/* Whether it holds its range within MS milliseconds. */
bool range_waiter_holds_within (struct range_waiter *w, unsigned ms);
/* Joins its thread, which must hold its range, and unlocks the range. */
void range_waiter_finish (struct range_waiter *w);

#endif /* MLOOP_TESTS_RANGE_WAITER_H */
