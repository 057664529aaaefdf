/* An image path is checked to be a regular file or block device before
 * the engine opens it (engine/backing.c); but the path may be a user's
 * (the base a user's overlay names, which root's commit opens), and a
 * FIFO or character device swapped in after the check (a symlink
 * changed, a directory on the path swapped) must not be opened: opening
 * one is itself an act (a watchdog started, a tape rewound).
 *
 * The window is made certain, not raced for: this program's stat() and
 * fstat() stand in for the C library's (the engine is linked in
 * statically) and rename a FIFO over the image just after the first
 * look at it.  The open must then serve the file it checked, or refuse;
 * inotify must see no open of the FIFO.  No root: about 0.01 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing.h"
#include "fifo_watch.h"
#include "unit.h"

#define IMAGE_SIZE (1u << 20)

static char fifo[2048], path[2048];
static bool swap_armed;

/* Renames the FIFO over the image, once armed. */
static void
swap_once (void)
{
  if (swap_armed) {
    swap_armed = false;
    CHECK (rename (fifo, path) == 0, "rename: %s", strerror (errno));
  }
}

int
stat (const char *name, struct stat *st)
{
  int r = fstatat (AT_FDCWD, name, st, 0);

  if (strcmp (name, path) == 0)
    swap_once ();
  return r;
}

int
fstat (int fd, struct stat *st)
{
  int r = fstatat (fd, "", st, AT_EMPTY_PATH);

  swap_once ();
  return r;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  struct mloop_backing b;
  char err[512];
  int in, r;

  unit_deadline (10);
  snprintf (fifo, sizeof fifo, "%s/fifo", dir);
  snprintf (path, sizeof path, "%s/base.img", dir);
  unit_make_image (path, IMAGE_SIZE);
  in = fifo_watch (fifo);

  swap_armed = true;
  r = mloop_backing_open (&b, path, MLOOP_DIRECT_AUTO, true, NULL, err,
                          sizeof err);
  CHECK (!swap_armed, "the image was never looked at");
  CHECK (!fifo_watch_opened (in),
         "the FIFO swapped in for a checked image was opened");
  if (r == 0) {
    CHECK (b.size == IMAGE_SIZE, "served %llu bytes, not the checked "
           "image's %u", (unsigned long long) b.size, IMAGE_SIZE);
    mloop_backing_close (&b);
  }
  printf ("ok: a FIFO swapped in for a checked image is never opened\n");
  return 0;
}
