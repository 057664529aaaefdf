/* `mloop overlay discard` and `commit` remove the overlay they checked
 * from the directory they found it in (device/overlay_file.c,
 * engine/overlay_merge.c), whatever a directory on its path becomes
 * meanwhile.  Root runs them on a user's overlay, whose directories
 * are that user's: checked by its path and then unlinked by the path
 * again, the overlay's name could be resolved in between through a
 * directory swapped for a symlink, and root would remove the file of
 * that name wherever the symlink leads (/etc/shadow, for an overlay
 * named shadow).
 *
 * The window is made certain, not raced for: this program's fstat()
 * stands in for the C library's (the engine and device code are linked
 * in statically) and, once the overlay is locked for its removal and
 * checked by name (discard), or the base synced and the overlay
 * checked by name (commit), swaps the overlay's directory for a
 * symlink to another holding a precious file of the overlay's name.
 * No root, no clock: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "device_state.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static char user_dir[2048], moved_dir[2048], other_dir[2048];
static struct stat overlay_st, base_st;
/* Set when the removal's lock is taken (discard) or the base synced
 * (commit): the next fstat() of the overlay swaps the directory.
 */
static enum { NOTHING, DISCARD, COMMIT } watching;
static bool armed, swapped;

static bool
is_file (int fd, const struct stat *st)
{
  struct stat now;

  return fstatat (fd, "", &now, AT_EMPTY_PATH) == 0 &&
    now.st_dev == st->st_dev && now.st_ino == st->st_ino;
}

static void
swap_directory (void)
{
  swapped = true;
  armed = false;
  watching = NOTHING;
  CHECK (rename (user_dir, moved_dir) == 0, "rename: %s", strerror (errno));
  CHECK (symlink (other_dir, user_dir) == 0, "symlink: %s",
         strerror (errno));
}

int
flock (int fd, int operation)
{
  if (watching == DISCARD && (operation & LOCK_EX) &&
      is_file (fd, &overlay_st))
    armed = true;
  return (int) syscall (SYS_flock, fd, operation);
}

int
fsync (int fd)
{
  if (watching == COMMIT && is_file (fd, &base_st))
    armed = true;
  return (int) syscall (SYS_fsync, fd);
}

int
fstat (int fd, struct stat *st)
{
  if (armed && is_file (fd, &overlay_st))
    swap_directory ();
  return fstatat (fd, "", st, AT_EMPTY_PATH);
}

/* Makes the overlay at PATH and the precious file of its name in
 * other_dir, and puts user_dir back in place.
 */
static void
prepare (const char *base_path, const char *path, const char *precious)
{
  int fd;

  if (swapped) {
    CHECK (unlink (user_dir) == 0 && rename (moved_dir, user_dir) == 0,
           "putting %s back: %s", user_dir, strerror (errno));
    swapped = false;
  }
  unit_make_overlay (base_path, path);
  CHECK (stat (path, &overlay_st) == 0, "%s: %s", path, strerror (errno));
  fd = open (precious, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  CHECK (fd >= 0 && write (fd, "keep", 4) == 4 && close (fd) == 0,
         "%s: %s", precious, strerror (errno));
  armed = false;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], precious[4096], moved[4096];
  char err[512], *base = NULL;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (user_dir, sizeof user_dir, "%s/user", dir);
  snprintf (moved_dir, sizeof moved_dir, "%s/user.moved", dir);
  snprintf (other_dir, sizeof other_dir, "%s/etc", dir);
  CHECK (mkdir (user_dir, 0700) == 0 && mkdir (other_dir, 0700) == 0,
         "mkdir: %s", strerror (errno));
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/shadow", user_dir);
  snprintf (precious, sizeof precious, "%s/shadow", other_dir);
  snprintf (moved, sizeof moved, "%s/shadow", moved_dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (stat (base_path, &base_st) == 0, "%s: %s", base_path,
         strerror (errno));

  prepare (base_path, path, precious);
  watching = DISCARD;
  r = mloop_overlay_file_discard (path, err, sizeof err);
  CHECK (swapped, "discard: the directory was never swapped");
  CHECK (access (precious, F_OK) == 0, "discard removed %s, reached "
         "through the directory swapped for a symlink", precious);
  CHECK (r == 0 && access (moved, F_OK) == -1, "discard did not remove "
         "the overlay it checked: %s", r == 0 ? "it stays" : err);

  prepare (base_path, path, precious);
  watching = COMMIT;
  r = mloop_overlay_file_commit (path, base_path, false, &base, err,
                                 sizeof err);
  free (base);
  CHECK (swapped, "commit: the directory was never swapped");
  CHECK (access (precious, F_OK) == 0, "commit removed %s, reached "
         "through the directory swapped for a symlink", precious);
  CHECK (r == 0 && access (moved, F_OK) == -1, "commit did not remove "
         "the overlay it merged: %s", r == 0 ? "it stays" : err);

  printf ("ok: discard and commit remove the overlay from its own "
          "directory only\n");
  return 0;
}
