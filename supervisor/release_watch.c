/* mloop-supervisor — noticing that the kernel let go of an autoclear
 * device (release_watch.h).
 */
#include <glib.h>

#include "autoclear.h"
#include "device_state.h"
#include "release_watch.h"

/* Whether the device is autoclear and gone for good, by its state now
 * (its node given back to root on the way: autoclear.h).
 */
static bool
released (const char *dir)
{
  struct mloop_device_state st;
  bool r;

  if (mloop_state_load (dir, &st) == -1)
    return false;               /* attach has not finished */
  r = st.autoclear && mloop_autoclear_finished (&st,
                                                &mloop_autoclear_kernel_now);
  mloop_state_clear (&st);
  return r;
}

static gboolean
tick (gpointer data)
{
  struct release_watch *w = data;
  int lock;

  if (!released (w->dir))
    return G_SOURCE_CONTINUE;
  /* Never wait for the lock: a detach holding it is stopping us. */
  lock = mloop_state_lock_device (w->dir, false);
  if (lock == -1)
    return G_SOURCE_CONTINUE;
  if (!released (w->dir)) {     /* looked again under the lock */
    mloop_state_unlock (lock);
    return G_SOURCE_CONTINUE;
  }
  w->source = 0;
  w->released (lock, w->data);
  return G_SOURCE_REMOVE;
}

void
release_watch_start (struct release_watch *w, const char *dir,
                     void (*released_fn) (int lock, void *data), void *data)
{
  w->dir = dir;
  w->released = released_fn;
  w->data = data;
  w->source = g_timeout_add (RELEASE_POLL_MS, tick, w);
}

void
release_watch_stop (struct release_watch *w)
{
  if (w->source != 0)
    g_source_remove (w->source);
  w->source = 0;
}
