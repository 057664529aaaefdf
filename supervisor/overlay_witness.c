/* A supervisor's witness of a copy-on-write overlay (overlay_witness.h). */
#include <errno.h>
#include <unistd.h>

#include "overlay_file.h"
#include "overlay.h"
#include "overlay_witness.h"
#include "say.h"

struct overlay_witness {
  int fd;
  char *overlay;
  FILE *log;
  /* The check under way: its thread; the source that ends it on the
   * caller's context (made before the thread and attached by it, so
   * free can destroy it), and what is called then.
   */
  GThread *thread;
  GSource *done;
  GMainContext *context;
  GSourceFunc then;
  gpointer then_data;
  int result;                   /* the thread's sync's, read once joined */
};

struct overlay_witness *
overlay_witness_open (const char *overlay, FILE *log)
{
  struct overlay_witness *w;
  int fd;

  if (overlay == NULL)
    return NULL;
  fd = mloop_overlay_witness_open (overlay);
  if (fd == -1) {
    say_to (log, "overlay %s: no descriptor to check its syncs with after "
            "a server's death: %s", overlay,
            errno == EINVAL ? "not a regular file" : g_strerror (errno));
    return NULL;
  }
  w = g_new0 (struct overlay_witness, 1);
  w->fd = fd;
  w->overlay = g_strdup (overlay);
  w->log = log;
  return w;
}

/* Says what a failed sync (negative errno R) of the witness means. */
static void
say_failed (struct overlay_witness *w, int r, const char *when)
{
  say_to (w->log, "a sync of overlay %s failed %s (%s): writes its server "
          "answered may be lost; marked, so every FLUSH fails until "
          "mloop overlay clear", w->overlay, when, g_strerror (-r));
}

/* The witness's sync on the calling thread; WHEN says when, if it fails. */
static void
sync_now (struct overlay_witness *w, const char *when)
{
  int r = mloop_overlay_witness_sync (w->fd);

  if (r < 0)
    say_failed (w, r, when);
}

static gpointer
check_thread (gpointer data)
{
  struct overlay_witness *w = data;

  w->result = mloop_overlay_witness_sync (w->fd);
  g_source_attach (w->done, w->context);
  return NULL;
}

/* Forgets the check once its thread has ended (it has attached DONE by
 * then: a source destroyed before it is attached may not be), and says
 * what its sync found.
 */
static void
check_clear (struct overlay_witness *w)
{
  g_thread_join (w->thread);
  w->thread = NULL;
  g_source_destroy (w->done);
  g_clear_pointer (&w->done, g_source_unref);
  g_clear_pointer (&w->context, g_main_context_unref);
  if (w->result < 0)
    say_failed (w, w->result, "after its server's exit");
}

/* The check's end, on the caller's context: THEN, which may free W. */
static gboolean
check_done (gpointer data)
{
  struct overlay_witness *w = data;

  check_clear (w);
  w->then (w->then_data);
  return G_SOURCE_REMOVE;
}

bool
overlay_witness_check (struct overlay_witness *w, GSourceFunc then,
                       gpointer data)
{
  if (w == NULL)
    return false;
  g_return_val_if_fail (w->thread == NULL, false);
  w->then = then;
  w->then_data = data;
  w->context = g_main_context_ref_thread_default ();
  w->done = g_idle_source_new ();
  g_source_set_priority (w->done, G_PRIORITY_DEFAULT);
  g_source_set_callback (w->done, check_done, w, NULL);
  w->thread = g_thread_try_new ("mloop-witness", check_thread, w, NULL);
  if (w->thread == NULL) {
    /* No thread to spare: the sync here and now, the loop held. */
    g_clear_pointer (&w->done, g_source_unref);
    g_clear_pointer (&w->context, g_main_context_unref);
    sync_now (w, "after its server's exit");
    return false;
  }
  return true;
}

bool
overlay_witness_busy (const struct overlay_witness *w)
{
  return w != NULL && w->thread != NULL;
}

void
overlay_witness_check_now (struct overlay_witness *w)
{
  if (w == NULL)
    return;
  if (w->thread != NULL)
    check_clear (w);
  sync_now (w, "as its server stopped");
}

void
overlay_witness_free (struct overlay_witness *w)
{
  if (w == NULL)
    return;
  if (w->thread != NULL)
    check_clear (w);
  close (w->fd);
  g_free (w->overlay);
  g_free (w);
}
