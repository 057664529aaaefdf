/* `mloop overlay adopt` records the image in the overlay it was named,
 * never in another one its name leads to by the time it is opened.
 *
 * Root runs adopt on users' overlays, in the users' directories.  The
 * command looked at the name (following a symbolic link there), then
 * opened the overlay by its path again: a link put in the overlay's
 * place, before the command or while it ran, or a directory on the
 * path swapped for one, led to another user's overlay, whose header
 * then recorded the image (any image of its size), its own base
 * forgotten: that user's next device served their writes over bytes
 * the first user chose.
 *
 * This program's access() stands in for the C library's (the engine
 * and device code are linked in statically) to swap the overlay's
 * directory for a link just before the adoption opens the overlay.  No
 * root: about 0.05 s.
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

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static char mine[4096], mine_away[4096], theirs[4096];
static char path[4096], their_path[4096];
static bool swap_dir;

int
access (const char *name, int mode)
{
  if (swap_dir && strcmp (name, path) == 0) {
    swap_dir = false;
    CHECK (rename (mine, mine_away) == 0 && symlink (theirs, mine) == 0,
           "%s: %s", mine, strerror (errno));
  }
  return (int) syscall (SYS_faccessat, AT_FDCWD, name, mode);
}

/* Whether the overlay at OVERLAY still records BASE. */
static bool
records (const char *overlay, const char *base)
{
  char *recorded = NULL, err[1024];
  uint64_t size;
  bool known, same;

  CHECK (mloop_overlay_inspect (overlay, &recorded, &size, &known, err,
                                sizeof err) == 0, "%s", err);
  same = strcmp (recorded, base) == 0;
  free (recorded);
  return same;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char my_base[4096], their_base[4096], chosen[4096], err[1024];
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (mine, sizeof mine, "%s/mine", dir);
  snprintf (mine_away, sizeof mine_away, "%s/mine.away", dir);
  snprintf (theirs, sizeof theirs, "%s/theirs", dir);
  snprintf (path, sizeof path, "%s/mine/disk.overlay", dir);
  snprintf (their_path, sizeof their_path, "%s/theirs/disk.overlay", dir);
  snprintf (my_base, sizeof my_base, "%s/my-base.img", dir);
  snprintf (their_base, sizeof their_base, "%s/their-base.img", dir);
  snprintf (chosen, sizeof chosen, "%s/chosen.img", dir);
  CHECK (mkdir (mine, 0700) == 0 && mkdir (theirs, 0700) == 0, "%s: %s",
         dir, strerror (errno));
  unit_make_image (my_base, BASE_SIZE);
  unit_make_image (their_base, BASE_SIZE);
  unit_make_image (chosen, BASE_SIZE);
  unit_make_overlay (their_base, their_path);

  /* A symbolic link in the overlay's place when the command starts. */
  CHECK (symlink (their_path, path) == 0, "%s: %s", path, strerror (errno));
  r = mloop_overlay_file_adopt (path, chosen, err, sizeof err);
  CHECK (records (their_path, their_base), "adopting %s, a link to %s, "
         "made the other overlay record %s", path, their_path, chosen);
  CHECK (r == -1 && strstr (err, "symbolic link"), "the adoption through "
         "a link was not refused as one: %s", r == 0 ? "adopted" : err);
  printf ("a link in the overlay's place: %s\n", err);

  /* The overlay itself there, its directory swapped for a link to the
   * other's as the adoption opens it.
   */
  CHECK (unlink (path) == 0, "%s: %s", path, strerror (errno));
  unit_make_empty_overlay (my_base, path);
  swap_dir = true;
  r = mloop_overlay_file_adopt (path, chosen, err, sizeof err);
  CHECK (!swap_dir, "the adoption never looked where the test swaps");
  CHECK (records (their_path, their_base), "the adoption rewrote another "
         "overlay (%s) to record %s", their_path, chosen);
  CHECK (r == -1, "the adoption of a swapped overlay succeeded");
  printf ("a directory swapped on the path: %s\n", err);

  /* Put back, the adoption goes through. */
  CHECK (unlink (mine) == 0 && rename (mine_away, mine) == 0, "%s: %s",
         mine, strerror (errno));
  r = mloop_overlay_file_adopt (path, chosen, err, sizeof err);
  CHECK (r == 0 && records (path, chosen), "adopting the overlay itself: %s",
         r == 0 ? "not recorded" : err);
  printf ("ok: adopt records the image in the overlay it was named only\n");
  return 0;
}
