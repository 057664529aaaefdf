/* A commit stopped half-way into a file other than the one the overlay
 * records: its base moved (`--base` names it), or replaced at its path
 * by a copy of itself (a restore, rsync, `mv` of a fresh copy), both
 * passing the merge's identity check by content; another image, by the
 * user's override (`--adopt-base`); the base of a version 1 overlay,
 * which records no identity.  The merge marks the header before its
 * first write into the base (mloop_overlay_note_merging), but the mark
 * excuses only the file the header records: for another inode, and
 * for version 1, it was not set, and for another path it did not
 * count.  Stopped half-way, the commit could not run again as it began,
 * and, with no mark, discard removed the overlay and left the image
 * half-merged, reading as neither.  The merge must record the file it
 * writes as the base, with the mark, before writing.
 *
 * A stopped commit is its mark and its first write, as in
 * test-overlay-discard-half-committed.c.  No root: about 0.05 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define CLUSTER_AT UNIT_OVERLAY_CLUSTER_AT

/* Writes byte B at OFFSET of PATH: true, or false with errno. */
static bool
pwrite_byte (const char *path, off_t offset, unsigned char b)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && pwrite (fd, &b, 1, offset) == 1;

  if (fd >= 0)
    close (fd);
  return ok;
}

static void
check_merged (const char *base_path)
{
  unsigned char byte = 0;
  int fd = open (base_path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &byte, 1, CLUSTER_AT) == 1, "%s: %s",
         base_path, strerror (errno));
  close (fd);
  CHECK (byte == 0x5a, "the base holds 0x%02x, not the overlay's 0x5a",
         byte);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], copy[4096], moved[4096], other[4096], path[4096];
  char err[512];
  char *written = NULL;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (copy, sizeof copy, "%s/copy.img", dir);
  snprintf (moved, sizeof moved, "%s/moved.img", dir);
  snprintf (other, sizeof other, "%s/other.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);

  /* The base replaced at its path by a copy of itself. */
  unit_make_tagged_image (base_path, BASE_SIZE, "template");
  unit_make_overlay (base_path, path);
  unit_make_tagged_image (copy, BASE_SIZE, "template");
  CHECK (rename (copy, base_path) == 0, "rename: %s", strerror (errno));
  unit_stop_commit (path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "discard removed an overlay whose commit into a copy of its base "
         "stopped half-way");
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0,
         "the commit stopped in a copy of the base cannot run again: %s",
         err);
  free (written);
  written = NULL;
  check_merged (base_path);
  CHECK (unlink (base_path) == 0, "unlink: %s", strerror (errno));

  /* The base moved, and the commit named it with --base. */
  unit_make_tagged_image (base_path, BASE_SIZE, "template");
  unit_make_overlay (base_path, path);
  CHECK (rename (base_path, moved) == 0, "rename: %s", strerror (errno));
  unit_stop_commit (path, moved, MLOOP_OVERLAY_MERGE_BASE);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "discard removed an overlay whose commit into its moved base "
         "stopped half-way");
  CHECK (mloop_overlay_file_commit (path, moved, false, &written, err,
                                    sizeof err) == 0,
         "the commit stopped in the moved base cannot run again: %s", err);
  free (written);
  written = NULL;
  check_merged (moved);
  CHECK (unlink (moved) == 0, "unlink: %s", strerror (errno));

  /* Another image, by the user's override (--adopt-base). */
  unit_make_tagged_image (base_path, BASE_SIZE, "template");
  unit_make_overlay (base_path, path);
  unit_make_tagged_image (other, BASE_SIZE, "template");
  CHECK (pwrite_byte (other, 0, 'X'), "%s: %s", other, strerror (errno));
  unit_stop_commit (path, other, MLOOP_OVERLAY_MERGE_ANY_BASE);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "discard removed an overlay whose commit into another image, by "
         "--adopt-base, stopped half-way");
  CHECK (mloop_overlay_file_commit (path, other, false, &written, err,
                                    sizeof err) == 0,
         "the commit stopped in another image cannot run again: %s", err);
  free (written);
  written = NULL;
  check_merged (other);

  /* A version 1 overlay, which records no identity. */
  unit_make_overlay (base_path, path);
  CHECK (pwrite_byte (path, 8, 1), "%s: %s", path, strerror (errno));
  unit_stop_commit (path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "discard removed a version 1 overlay whose commit stopped "
         "half-way");
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0,
         "the commit stopped in a version 1 overlay's base cannot run "
         "again: %s", err);
  free (written);
  check_merged (base_path);

  printf ("ok: a commit stopped in a file the overlay did not record "
          "runs again, and discard refuses it meanwhile\n");
  return 0;
}
