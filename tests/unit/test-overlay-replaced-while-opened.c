/* A server opening an overlay that is replaced between its open() and
 * its lock must serve the file the path names, with one file for its
 * data and its map.  Replaced: a `mloop overlay discard` or `commit`
 * removed it under its lock, then another server made a new one at the
 * path.  Holding the old file (whose lock is free again) with its map
 * descriptor opened by the path on the new one, the server would write
 * its map words into the other server's overlay, and answer writes into
 * a file no name reaches.  It must open the overlay at the path again
 * (engine/overlay.c, mloop_overlay_open).
 *
 * The window is made certain, not raced for: this program's flock()
 * stands in for the C library's (the engine is linked in statically)
 * and, once armed, renames another overlay over the path just before
 * taking the lock.  No root, no clock: about 0.05 s, in the unit suite
 * of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backing.h"
#include "overlay.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static const char *overlay_path, *other_overlay;
static bool replace_before_lock;

/* The engine's flock(): replaces the overlay once when armed. */
int
flock (int fd, int operation)
{
  if (replace_before_lock) {
    replace_before_lock = false;
    CHECK (rename (other_overlay, overlay_path) == 0, "rename %s: %s",
           other_overlay, strerror (errno));
  }
  return (int) syscall (SYS_flock, fd, operation);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], other[4096], err[512];
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct stat held, map, named;
  int r;

  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (other, sizeof other, "%s/other-overlay", dir);
  overlay_path = path;
  other_overlay = other;
  unit_make_image (base_path, BASE_SIZE);
  r = mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                          err, sizeof err);
  CHECK (r == 0, "base: %s", err);
  /* The overlay at the path, and the one that will replace it. */
  for (int i = 0; i < 2; i++) {
    r = mloop_overlay_open (&ov, i ? other : path, &base, false,
                            MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
    CHECK (r == 0, "making an overlay: %s", err);
    mloop_overlay_close (&ov);
  }

  replace_before_lock = true;
  r = mloop_overlay_open (&ov, path, &base, false, MLOOP_OVERLAY_SAME_BASE,
                          err, sizeof err);
  CHECK (!replace_before_lock, "the overlay was never locked");
  CHECK (r == 0, "the overlay at the path was not opened: %s", err);
  CHECK (fstat (ov.fd, &held) == 0 && fstat (ov.map_fd, &map) == 0,
         "fstat: %s", strerror (errno));
  CHECK (map.st_dev == held.st_dev && map.st_ino == held.st_ino,
         "the overlay's data and map descriptors are two files: its map "
         "words would go into another server's overlay");
  CHECK (stat (path, &named) == 0 && named.st_dev == held.st_dev &&
         named.st_ino == held.st_ino,
         "the server holds an overlay its path no longer names: the "
         "writes it answers would vanish with it");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  printf ("ok: an overlay replaced while opened is opened again\n");
  return 0;
}
