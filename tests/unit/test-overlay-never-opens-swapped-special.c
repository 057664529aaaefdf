/* An overlay is only ever a regular file, and what its path names is
 * checked before it is opened (engine/overlay.c, refuse_special); but
 * the path is the caller's, and root runs commit, discard and adopt on
 * users' overlays: a FIFO or device node swapped in between the check
 * and the open (a symlink changed, a directory on the path swapped)
 * would be opened all the same, by root (a watchdog started, a tape
 * rewound).  Each entry point must open only the regular file it
 * checked.
 *
 * The windows are made certain, not raced for: this program's stat()
 * stands in for the C library's (the engine is linked in statically)
 * and renames a FIFO over the overlay just after the check; discard's
 * second open, under the state lock, is reached by holding that lock
 * while a child's discard reads the header (inotify), then renaming the
 * FIFO over the overlay.  Inotify must see no open of the FIFO.
 * No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backing.h"
#include "held_discard.h"
#include "fifo_watch.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static char fifo[2048], path[2048];
static bool swap_after_stat;

/* The engine's stat(): renames the FIFO over the overlay once armed. */
int
stat (const char *name, struct stat *st)
{
  int r = fstatat (AT_FDCWD, name, st, 0);

  if (swap_after_stat && strcmp (name, path) == 0) {
    swap_after_stat = false;
    CHECK (rename (fifo, path) == 0, "rename: %s", strerror (errno));
  }
  return r;
}

/* Fails when the watch IN has seen the FIFO opened since last asked. */
static void
check_not_opened (int in, const char *what)
{
  CHECK (!fifo_watch_opened (in), "%s opened the FIFO swapped in for the "
         "overlay it had checked", what);
}

/* An overlay at PATH again, the FIFO at its own name. */
static void
restore (const char *base_path)
{
  struct stat st;

  if (fstatat (AT_FDCWD, path, &st, 0) == 0 && S_ISFIFO (st.st_mode))
    CHECK (rename (path, fifo) == 0, "rename: %s", strerror (errno));
  unlink (path);
  unit_make_overlay (base_path, path);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], err[512];
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct held_discard discard;
  char *recorded = NULL;
  int in, status;
  uint64_t size;
  bool known;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (fifo, sizeof fifo, "%s/fifo", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  unit_make_image (base_path, BASE_SIZE);
  in = fifo_watch (fifo);

  restore (base_path);
  CHECK (mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                             err, sizeof err) == 0, "base: %s", err);
  swap_after_stat = true;
  CHECK (mloop_overlay_open (&ov, path, &base, false, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err) < 0,
         "a FIFO was served as an overlay");
  check_not_opened (in, "a server");
  mloop_backing_close (&base);

  restore (base_path);
  swap_after_stat = true;
  CHECK (mloop_overlay_inspect (path, &recorded, &size, &known, err,
                                sizeof err) < 0, "a FIFO was inspected");
  check_not_opened (in, "inspect (discard, commit)");

  restore (base_path);
  swap_after_stat = true;
  CHECK (mloop_overlay_adopt (path, base_path, err, sizeof err) < 0,
         "a FIFO adopted a base");
  check_not_opened (in, "adopt");

  restore (base_path);
  swap_after_stat = true;
  CHECK (mloop_overlay_merge (path, base_path, false, true, err,
                              sizeof err) < 0, "a FIFO was merged");
  check_not_opened (in, "a merge");

  /* Discard opens the overlay again under the state lock. */
  restore (base_path);
  held_discard_start (&discard, path, held_discard_run);
  CHECK (rename (fifo, path) == 0, "rename: %s", strerror (errno));
  status = held_discard_finish (&discard);
  check_not_opened (in, "discard");
  CHECK (WIFEXITED (status) && WEXITSTATUS (status) == 1,
         "discard did not refuse the FIFO put at the overlay's name");

  printf ("ok: a FIFO swapped in for a checked overlay is never opened\n");
  return 0;
}
