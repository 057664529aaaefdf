/* An unlock wakes every waiter it frees (engine/range_lock.c): threads
 * waiting for ranges that overlap the released one, but not each other,
 * all get theirs, at the same time; a waiter still overlapping another
 * held range keeps waiting.  Waking only one would leave the others
 * asleep until some later unlock that may never come.
 *
 * Thread model: the main thread holds [0, 3 * 4096) and one more range;
 * WAITERS threads wait for their own block of it, and one more thread
 * for a range that also overlaps the other held range.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "range-waiter.h"
#include "range_lock.h"
#include "unit.h"

#define WAITERS 3
#define BLOCK 4096

static struct mloop_range_lock lock;

static unsigned
count_holding (struct range_waiter *w, int n)
{
  unsigned holding = 0;

  for (int i = 0; i < n; i++)
    holding += atomic_load (&w[i].holds);
  return holding;
}

/* Whether thread TID is asleep ('S'): these threads do nothing but take
 * the lock, so asleep is waiting for it.
 */
static bool
asleep (pid_t tid)
{
  char path[64], stat[512], *state;
  FILE *f;
  bool s = false;

  snprintf (path, sizeof path, "/proc/self/task/%d/stat", (int) tid);
  f = fopen (path, "r");
  if (f == NULL)
    return false;
  if (fgets (stat, sizeof stat, f) && (state = strrchr (stat, ')')) != NULL)
    s = state[1] == ' ' && state[2] == 'S';
  fclose (f);
  return s;
}

/* Waits until every waiter sleeps on the lock: only then does an unlock
 * have anyone to wake.  Unlike a fixed sleep, this holds on a loaded
 * machine too.
 */
static void
wait_until_asleep (struct range_waiter *w, int n)
{
  for (unsigned waited = 0; waited < 10000; waited++) {
    int sleeping = 0;

    for (int i = 0; i < n; i++)
      sleeping += atomic_load (&w[i].tid) != 0 && asleep (atomic_load (&w[i].tid));
    if (sleeping == n)
      return;
    unit_sleep_ms (1);
  }
  unit_fail (__FILE__, __LINE__, "asleep", "waiters not asleep after 10 s");
}

int
main (void)
{
  struct range_waiter w[WAITERS + 1];
  struct mloop_range held, other;
  unsigned waited;

  unit_deadline (60);
  mloop_range_lock_init (&lock);
  mloop_range_lock (&lock, &held, 0, WAITERS * BLOCK);
  mloop_range_lock (&lock, &other, 10 * BLOCK, 11 * BLOCK);
  for (int i = 0; i < WAITERS; i++)
    range_waiter_start (&w[i], &lock, (uint64_t) i * BLOCK,
                        (uint64_t) (i + 1) * BLOCK);
  /* The last one also overlaps OTHER, which stays held. */
  range_waiter_start (&w[WAITERS], &lock, 2 * BLOCK, 11 * BLOCK);
  wait_until_asleep (w, WAITERS + 1);
  CHECK (count_holding (w, WAITERS + 1) == 0,
         "a range overlapping a held one was granted");

  mloop_range_unlock (&lock, &held);
  for (waited = 0; waited < 10000; waited++) {
    if (count_holding (w, WAITERS) == WAITERS)
      break;
    unit_sleep_ms (1);
  }
  CHECK (count_holding (w, WAITERS) == WAITERS,
         "one unlock woke %u of %d waiters it freed within 10 s",
         count_holding (w, WAITERS), WAITERS);
  /* Block 2, now held, and OTHER overlap the last waiter's range: it
   * must still wait, and go on waiting for OTHER once the blocks go.
   */
  CHECK (!range_waiter_holds_within (&w[WAITERS], 100),
         "a waiter overlapping a still-held range was granted");

  for (int i = 0; i < WAITERS; i++)
    range_waiter_finish (&w[i]);
  CHECK (!range_waiter_holds_within (&w[WAITERS], 100),
         "a waiter overlapping a still-held range was granted");
  mloop_range_unlock (&lock, &other);
  range_waiter_finish (&w[WAITERS]);

  mloop_range_lock_destroy (&lock);
  printf ("ok: one unlock woke all %d waiters it freed\n", WAITERS);
  return 0;
}
