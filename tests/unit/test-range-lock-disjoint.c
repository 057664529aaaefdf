/* Disjoint ranges do not exclude each other (engine/range_lock.c): ranges
 * that share no byte, even adjacent ones, are held at the same time by
 * different threads.
 *
 * Thread model: THREADS threads each lock their own range, then wait,
 * still holding it, until all have theirs.  A lock that serialized them
 * would leave all but one waiting forever: the deadline fails the test.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "range_lock.h"
#include "unit.h"

#define THREADS 8

static struct mloop_range_lock lock;
static atomic_int holding;

/* Adjacent ranges of assorted sizes, and two far away. */
static const uint64_t ranges[THREADS][2] = {
  { 0, 1 }, { 1, 512 }, { 512, 4096 }, { 4096, 4097 },
  { 4097, 1 << 20 }, { 1 << 20, 2 << 20 },
  { UINT64_C (1) << 40, (UINT64_C (1) << 40) + 4096 },
  { UINT64_MAX - 1, UINT64_MAX },
};

static void *
holder_main (void *arg)
{
  const uint64_t *r = arg;
  struct mloop_range range;

  mloop_range_lock (&lock, &range, r[0], r[1]);
  atomic_fetch_add (&holding, 1);
  while (atomic_load (&holding) < THREADS)
    unit_sleep_ms (1);
  mloop_range_unlock (&lock, &range);
  return NULL;
}

int
main (void)
{
  pthread_t t[THREADS];
  struct mloop_range mine;

  /* Ten seconds for eight threads to take a mutex once each. */
  unit_deadline (10);
  mloop_range_lock_init (&lock);
  for (int i = 0; i < THREADS; i++)
    CHECK (pthread_create (&t[i], NULL, holder_main, (void *) ranges[i]) == 0,
           "pthread");
  for (int i = 0; i < THREADS; i++)
    pthread_join (t[i], NULL);
  CHECK (lock.held == NULL, "ranges still held after every unlock");

  /* And a range between held ones, in this thread, does not wait. */
  struct mloop_range left, right;

  mloop_range_lock (&lock, &left, 0, 4096);
  mloop_range_lock (&lock, &right, 8192, 12288);
  mloop_range_lock (&lock, &mine, 4096, 8192);
  mloop_range_unlock (&lock, &mine);
  mloop_range_unlock (&lock, &right);
  mloop_range_unlock (&lock, &left);

  mloop_range_lock_destroy (&lock);
  printf ("ok: %d disjoint ranges held at once\n", THREADS);
  return 0;
}
