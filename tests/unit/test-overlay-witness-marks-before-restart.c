/* A supervisor's witness of an overlay (supervisor/overlay_witness.h)
 * marks a failure the server took with it, before the restart.
 *
 * A server killed while a sync that then failed was under way took the
 * kernel's one report with it; no later opener is told.  The witness,
 * opened before and synced only after the server's exit, still is: its
 * check marks the header before it calls back (the restart), and the
 * next server fails its FLUSH.  A witness freed while its check is
 * under way (the device stopped) waits for the sync and never calls
 * back: the keeper it would call is gone.  Without a thread to be had,
 * the check syncs on the caller's thread rather than not at all (or
 * abort the process, and mloopd's every device with it).
 *
 * This program's fdatasync stands in for the C library's (the engine is
 * linked in statically): armed, the witness's first sync fails with
 * EIO, as the report of the lost pages; slow, it takes 0.2 s.  No root:
 * about 0.3 s, in the unit suite of every tier.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <glib.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "overlay_witness.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define SLOW_SYNC_US 200000

/* The server's descriptors are the fixture's; the witness's is the one
 * opened last (its check's are the only syncs before the next open).
 */
static volatile bool armed, slow;

static int
sync_interposed (int fd, long call)
{
  if (slow)
    g_usleep (SLOW_SYNC_US);
  if (armed) {
    armed = false;
    errno = EIO;
    return -1;
  }
  return unit_sync_really (fd, call);
}

/* GLib's threads come from here: armed, the next cannot be made. */
static volatile bool no_thread;

int
pthread_create (pthread_t *thread, const pthread_attr_t *attr,
                void *(*start) (void *), void *arg)
{
  static int (*real) (pthread_t *, const pthread_attr_t *,
                      void *(*) (void *), void *);

  if (no_thread) {
    no_thread = false;
    return EAGAIN;
  }
  if (real == NULL)
    real = dlsym (RTLD_NEXT, "pthread_create");
  return real (thread, attr, start, arg);
}

static gboolean
restart (gpointer data)
{
  g_main_loop_quit (data);
  return G_SOURCE_REMOVE;
}

static gboolean
never (gpointer data)
{
  *(bool *) data = true;
  return G_SOURCE_REMOVE;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096];
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct overlay_witness *w;
  GMainLoop *loop = g_main_loop_new (NULL, FALSE);
  bool called = false;
  int r;

  unit_sync_hook = sync_interposed;
  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_empty_overlay (base_path, path);
  CHECK (overlay_witness_open (NULL, stderr) == NULL,
         "a witness of no overlay");
  CHECK (!overlay_witness_check (NULL, never, &called),
         "a check without a witness");

  /* Stopped while its check is under way: no call back. */
  w = overlay_witness_open (path, stderr);
  CHECK (w != NULL, "no witness of %s", path);
  slow = true;
  CHECK (overlay_witness_check (w, never, &called), "the check did not start");
  overlay_witness_free (w);
  slow = false;
  while (g_main_context_iteration (NULL, FALSE))
    ;
  CHECK (!called, "a witness freed during its check called back");

  /* The server's exit; the witness's sync is told of the failure. */
  w = overlay_witness_open (path, stderr);
  CHECK (w != NULL, "no witness of %s", path);
  armed = true;
  CHECK (overlay_witness_check (w, restart, loop), "the check did not start");
  g_main_loop_run (loop);
  CHECK (!armed, "the witness's check never synced");

  /* The restart, before the witness is closed. */
  unit_open_overlay (&base, &ov, base_path, path);
  r = mloop_overlay_commit (&ov);
  CHECK (r < 0, "the next server's FLUSH succeeded after the witness's "
         "sync failed");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  overlay_witness_free (w);

  /* No thread to be had (a process at its limit): the sync all the
   * same, on the caller's thread, and no call back.
   */
  CHECK (unlink (path) == 0, "unlink %s: %s", path, strerror (errno));
  unit_make_empty_overlay (base_path, path);
  w = overlay_witness_open (path, stderr);
  CHECK (w != NULL, "no witness of %s", path);
  armed = true;
  no_thread = true;
  CHECK (!overlay_witness_check (w, never, &called),
         "a check without a thread said it would call back");
  CHECK (!armed, "without a thread, the witness never synced");
  while (g_main_context_iteration (NULL, FALSE))
    ;
  CHECK (!called, "a check without a thread called back");
  overlay_witness_free (w);
  unit_open_overlay (&base, &ov, base_path, path);
  r = mloop_overlay_commit (&ov);
  CHECK (r < 0, "without a thread, the next server's FLUSH succeeded "
         "after the witness's sync failed");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  g_main_loop_unref (loop);

  printf ("ok: the witness's failed sync reaches the next server, with "
          "or without a thread of its own; a witness freed in its check "
          "calls nobody\n");
  return 0;
}
