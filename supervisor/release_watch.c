/* mloop-supervisor — noticing that the kernel let go of an autoclear device. */
#include <glib.h>

#include "autoclear.h"
#include "device_state.h"
#include "release_watch.h"

static const char *watched_dir;
static void (*on_released) (int lock);

/* Whether the device is autoclear and gone for good, by its state now
 * (its node given back to root on the way: autoclear.h).
 */
static bool
released (void)
{
  struct mloop_device_state st;
  bool r;

  if (mloop_state_load (watched_dir, &st) == -1)
    return false;               /* attach has not finished */
  r = st.autoclear && mloop_autoclear_finished (&st,
                                                &mloop_autoclear_kernel_now);
  mloop_state_clear (&st);
  return r;
}

static gboolean
tick (gpointer unused)
{
  int lock;

  if (!released ())
    return G_SOURCE_CONTINUE;
  /* Never wait for the lock: a detach holding it is stopping us. */
  lock = mloop_state_lock_device (watched_dir, false);
  if (lock == -1)
    return G_SOURCE_CONTINUE;
  if (!released ()) {           /* looked again under the lock */
    mloop_state_unlock (lock);
    return G_SOURCE_CONTINUE;
  }
  on_released (lock);
  return G_SOURCE_REMOVE;
}

void
mloop_release_watch (const char *dir, void (*released_fn) (int lock))
{
  watched_dir = dir;
  on_released = released_fn;
  g_timeout_add (RELEASE_POLL_MS, tick, NULL);
}
