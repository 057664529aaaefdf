/* `mloop overlay commit` merges only the overlay it was named and
 * checked, never another one its name leads to by the time it is
 * opened.
 *
 * Root runs the commit on users' overlays, in the users' directories.
 * The command read the overlay's header for the base to write and
 * looked at its name (no symbolic link), then the merge opened the
 * overlay by its path again: the user could put a symbolic link in its
 * place in between, or swap a directory on the path for one, to
 * another user's overlay, of the same size.  That overlay was then
 * merged into the base the first header named, a copy of its own base
 * (a public cloud image both started from, alike at both ends): its
 * clusters, another user's writes, landed in the first user's image,
 * and it was left marked as committed there, its own device refused.
 * Only the commit's last look at the name (before the unlink) saw the
 * swap, after the merge.
 *
 * This program's fstatat() and access() stand in for the C library's
 * (the engine and device code are linked in statically): the first
 * puts a symbolic link in the overlay's place right after the merge's
 * look at the name, the second swaps the overlay's directory for one
 * as the merge begins.  No root: about 0.1 s.
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

/* Two users' directories: the first's overlay (in mine/), the second's
 * (in theirs/), both named disk.overlay.
 */
static char mine[4096], mine_away[4096], theirs[4096];
static char path[4096], their_path[4096], moved_path[4096];
static bool swap_name, swap_dir;

static void
link_in_place (void)
{
  CHECK (rename (path, moved_path) == 0, "%s: %s", path, strerror (errno));
  CHECK (symlink (their_path, path) == 0, "%s: %s", path, strerror (errno));
}

static void
swap_directory (void)
{
  CHECK (rename (mine, mine_away) == 0, "%s: %s", mine, strerror (errno));
  CHECK (symlink (theirs, mine) == 0, "%s: %s", mine, strerror (errno));
}

int
fstatat (int dirfd, const char *name, struct stat *st, int flags)
{
  int r = (int) syscall (SYS_newfstatat, dirfd, name, st, flags);

  if (swap_name && (flags & AT_SYMLINK_NOFOLLOW) &&
      strcmp (name, "disk.overlay") == 0) {
    swap_name = false;
    link_in_place ();
  }
  return r;
}

int
access (const char *name, int mode)
{
  if (swap_dir && strcmp (name, path) == 0) {
    swap_dir = false;
    swap_directory ();
  }
  return (int) syscall (SYS_faccessat, AT_FDCWD, name, mode);
}

/* Commits the first user's overlay with SWAP set, and checks that the
 * second's was neither merged nor marked.
 */
static void
commit_swapped (const char *what, bool *swap, const char *my_base,
                const char *their_base, const char *their_overlay)
{
  char err[1024], *written = NULL;
  int r;

  *swap = true;
  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  CHECK (!*swap, "%s: the commit never looked where the test swaps", what);
  CHECK (unit_byte_at (my_base, UNIT_OVERLAY_CLUSTER_AT) != 0x5a,
         "%s: the commit wrote another overlay (%s) into %s", what,
         their_path, my_base);
  CHECK (!unit_still_marks (their_overlay, my_base), "%s: the commit "
         "marked another overlay (%s) as committed into %s", what,
         their_path, my_base);
  CHECK (unit_byte_at (their_base, UNIT_OVERLAY_CLUSTER_AT) != 0x5a,
         "%s: the commit wrote into the other overlay's base", what);
  printf ("%s: %s\n", what, r == 0 ? "committed the overlay named" : err);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char my_base[4096], their_base[4096];

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (mine, sizeof mine, "%s/mine", dir);
  snprintf (mine_away, sizeof mine_away, "%s/mine.away", dir);
  snprintf (theirs, sizeof theirs, "%s/theirs", dir);
  snprintf (path, sizeof path, "%s/mine/disk.overlay", dir);
  snprintf (moved_path, sizeof moved_path, "%s/mine/kept.overlay", dir);
  snprintf (their_path, sizeof their_path, "%s/theirs/disk.overlay", dir);
  snprintf (my_base, sizeof my_base, "%s/my-base.img", dir);
  snprintf (their_base, sizeof their_base, "%s/their-base.img", dir);
  CHECK (mkdir (mine, 0700) == 0 && mkdir (theirs, 0700) == 0, "%s: %s",
         dir, strerror (errno));
  /* Alike at both ends: one image both users copied. */
  unit_make_image (their_base, BASE_SIZE);
  unit_copy_file (their_base, my_base);

  /* Mine holds nothing; theirs holds a cluster of 0x5a. */
  unit_make_empty_overlay (my_base, path);
  unit_make_overlay (their_base, their_path);
  commit_swapped ("a symbolic link put in the overlay's place", &swap_name,
                  my_base, their_base, their_path);

  /* Put back, and the same through a directory swapped on the path. */
  CHECK (unlink (path) == 0 && rename (moved_path, path) == 0, "%s: %s",
         path, strerror (errno));
  commit_swapped ("the overlay's directory swapped for a link", &swap_dir,
                  my_base, their_base, their_path);

  printf ("ok: a commit merges only the overlay it was named\n");
  return 0;
}
