/* mloop — a lock over byte ranges of the backing store.
 *
 * Serializes read-modify-write of partial blocks: two unaligned writes to
 * different bytes of one block must not both read the old block and then
 * each write back a copy missing the other's bytes.  Held ranges are few
 * (only unaligned writes take them), so a list under one mutex suffices.
 */
#ifndef MLOOP_RANGE_LOCK_H
#define MLOOP_RANGE_LOCK_H

#include <pthread.h>
#include <stdint.h>

struct mloop_range {
  uint64_t start, end;          /* [start, end) */
  struct mloop_range *next;
};

struct mloop_range_lock {
  pthread_mutex_t mutex;
  pthread_cond_t released;
  struct mloop_range *held;
};

void mloop_range_lock_init (struct mloop_range_lock *l);
void mloop_range_lock_destroy (struct mloop_range_lock *l);

/* Blocks until [START, END) overlaps no held range, then holds it,
 * recording it in R (caller-owned until unlock).
 */
void mloop_range_lock (struct mloop_range_lock *l, struct mloop_range *r,
                       uint64_t start, uint64_t end);
void mloop_range_unlock (struct mloop_range_lock *l, struct mloop_range *r);

#endif /* MLOOP_RANGE_LOCK_H */
