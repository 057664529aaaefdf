/* mloop — how long each step of an attach takes.  See steps.h. */
#include <glib.h>

#include "steps.h"

void
mloop_steps_start (struct mloop_steps *s)
{
  s->mark = g_get_monotonic_time ();
}

void
mloop_step_done (struct mloop_steps *s, const char *step)
{
  int64_t now;

  if (s == NULL || s->done == NULL)
    return;
  now = g_get_monotonic_time ();
  s->done (step, (double) (now - s->mark) / 1000.0, s->arg);
  s->mark = now;
}
