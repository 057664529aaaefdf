/* Overlapping ranges exclude each other (engine/range_lock.c): while one
 * thread holds a range, another asking for any range sharing a byte with
 * it waits, and gets it once the first lets go.  Under contention, no two
 * threads ever hold overlapping ranges at once.
 *
 * Thread model: the main thread holds a range while a waiter thread asks
 * for an overlapping one; then THREADS threads take ranges that all cover
 * one byte, counting themselves in and out.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "range-waiter.h"
#include "range_lock.h"
#include "unit.h"

#define THREADS 4
#define ROUNDS 20000

static struct mloop_range_lock lock;

/* Pairs of ranges [start, end) sharing at least one byte. */
static const struct {
  uint64_t held_start, held_end, want_start, want_end;
} pairs[] = {
  { 0, 4096, 4095, 8192 },                  /* the last byte */
  { 4096, 8192, 0, 4097 },                  /* the first byte */
  { 0, 1 << 20, 512, 1024 },                /* inside */
  { 512, 1024, 0, 1 << 20 },                /* around */
  { 100, 101, 100, 101 },                   /* the same byte */
  { UINT64_MAX - 4096, UINT64_MAX, UINT64_MAX - 1, UINT64_MAX },
};

/* Every holder of a range covering byte 4096 counts itself here. */
static atomic_int inside;
static unsigned long counter;           /* a plain variable, under the lock */
static atomic_int max_inside;

static void *
contender_main (void *arg)
{
  unsigned seed = (unsigned) (uintptr_t) arg;

  for (int i = 0; i < ROUNDS; i++) {
    struct mloop_range r;
    uint64_t start = 4096 - rand_r (&seed) % 4096;
    uint64_t end = 4097 + rand_r (&seed) % 4096;
    int n;

    mloop_range_lock (&lock, &r, start, end);
    n = atomic_fetch_add (&inside, 1) + 1;
    if (n > atomic_load (&max_inside))
      atomic_store (&max_inside, n);
    counter++;
    atomic_fetch_sub (&inside, 1);
    mloop_range_unlock (&lock, &r);
  }
  return NULL;
}

int
main (void)
{
  pthread_t t[THREADS];

  unit_deadline (60);
  mloop_range_lock_init (&lock);

  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    struct mloop_range held;
    struct range_waiter w;

    mloop_range_lock (&lock, &held, pairs[i].held_start, pairs[i].held_end);
    range_waiter_start (&w, &lock, pairs[i].want_start, pairs[i].want_end);
    /* A correct lock never lets it in: 100 ms to catch one that does. */
    CHECK (!range_waiter_holds_within (&w, 100),
           "[%llu, %llu) was granted while [%llu, %llu) was held",
           (unsigned long long) w.start, (unsigned long long) w.end,
           (unsigned long long) pairs[i].held_start,
           (unsigned long long) pairs[i].held_end);
    mloop_range_unlock (&lock, &held);
    CHECK (range_waiter_holds_within (&w, 10000),
           "[%llu, %llu) not granted within 10 s of the unlock",
           (unsigned long long) w.start, (unsigned long long) w.end);
    range_waiter_finish (&w);
  }

  for (uintptr_t i = 0; i < THREADS; i++)
    CHECK (pthread_create (&t[i], NULL, contender_main, (void *) (i + 1)) == 0,
           "pthread");
  for (int i = 0; i < THREADS; i++)
    pthread_join (t[i], NULL);
  CHECK (atomic_load (&max_inside) == 1,
         "%d threads held ranges covering byte 4096 at once",
         atomic_load (&max_inside));
  CHECK (counter == (unsigned long) THREADS * ROUNDS,
         "%lu increments under the lock, expected %lu", counter,
         (unsigned long) THREADS * ROUNDS);
  CHECK (lock.held == NULL, "ranges still held after every unlock");

  mloop_range_lock_destroy (&lock);
  printf ("ok: overlapping ranges exclude each other (%zu pairs, "
          "%d threads x %d rounds)\n", sizeof pairs / sizeof pairs[0],
          THREADS, ROUNDS);
  return 0;
}
