/* mloop — how long each step of an attach takes (mloop attach --verbose).
 *
 * The caller owns a struct mloop_steps and says what to do with each
 * step's time; the library marks the end of each step.  Steps are timed
 * from the previous mark, so their times add up to the whole.
 */
#ifndef MLOOP_DEVICE_STEPS_H
#define MLOOP_DEVICE_STEPS_H

#include <stdint.h>

struct mloop_steps {
  void (*done) (const char *step, double ms, void *arg);
  void *arg;
  int64_t mark;                 /* monotonic µs of the last mark */
};

/* Starts timing (the first step is timed from here). */
void mloop_steps_start (struct mloop_steps *s);

/* Ends STEP: calls S->done with its time.  S may be NULL (not timed). */
void mloop_step_done (struct mloop_steps *s, const char *step);

#endif /* MLOOP_DEVICE_STEPS_H */
