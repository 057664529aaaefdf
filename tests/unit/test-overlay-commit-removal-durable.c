/* `mloop overlay commit` makes the overlay's removal durable, as
 * discard does: its directory is synced after the unlink
 * (engine/overlay_merge.c).  Undone by a power cut, the removal would
 * bring back an overlay of writes the base already holds, with the
 * merge's mark: a device attached later with that name would serve its
 * clusters over whatever the base was given since, and discard would
 * refuse it and advise the commit that writes them over the base again.
 *
 * This program's unlinkat() and fsync() stand in for the C library's
 * (the engine and device code are linked in statically) and note, for
 * commit and then discard, whether the overlay's directory is synced
 * after the overlay's name is unlinked from it.  No root, no clock:
 * about 0.03 s, in the unit suite of every tier.
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

static struct stat dir_st;
static bool unlinked, synced_after;

static bool
is_dir (int fd)
{
  struct stat now;

  return fstatat (fd, "", &now, AT_EMPTY_PATH) == 0 &&
    now.st_dev == dir_st.st_dev && now.st_ino == dir_st.st_ino;
}

int
unlinkat (int dirfd, const char *name, int flags)
{
  int r = (int) syscall (SYS_unlinkat, dirfd, name, flags);

  if (r == 0 && strcmp (name, "overlay") == 0 && is_dir (dirfd))
    unlinked = true;
  return r;
}

int
fsync (int fd)
{
  if (unlinked && is_dir (fd))
    synced_after = true;
  return (int) syscall (SYS_fsync, fd);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], err[512], *written = NULL;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (stat (dir, &dir_st) == 0, "%s: %s", dir, strerror (errno));

  unit_make_overlay (base_path, path);
  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  CHECK (r == 0, "commit: %s", err);
  CHECK (unlinked, "commit did not unlink the overlay from %s", dir);
  CHECK (synced_after, "commit unlinked the overlay but never synced its "
         "directory: a power cut can bring it back");

  unlinked = synced_after = false;
  unit_make_overlay (base_path, path);
  r = mloop_overlay_file_discard (path, err, sizeof err);
  CHECK (r == 0, "discard: %s", err);
  CHECK (unlinked && synced_after, "discard did not sync its directory "
         "after the unlink");
  return 0;
}
