/* A commit stopped half-way marks the overlay: its base holds part of
 * the overlay already, and discard refuses it.  Moved to another
 * filesystem (mv copies, then unlinks) the half-merged base is another
 * file, of another inode, and nothing is at the recorded path any more,
 * so the refusal of a copy while the marked file is still there does
 * not apply.  Where the merge wrote only clusters past the first and
 * past the last MiB, the moved file keeps the recorded ends: a server
 * given it without any override took it for a copy of the base, served
 * it and recorded it without the mark, and discard then removed the
 * overlay the moved, half-merged base still needs.
 *
 * While the overlay carries the mark, a server must refuse any image
 * but the recorded file unless told to adopt it, the mark staying; a
 * commit into the moved file (--base) still finishes the merge.
 *
 * No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
/* Clusters between the first and the last MiB: the fingerprint's ends
 * do not see them.  The merge stops after the first.
 */
#define MERGED_AT (2u << 20)
#define UNMERGED_AT (MERGED_AT + MLOOP_OVERLAY_CLUSTER)

/* Leaves BASE_PATH as a merge of the overlay at OV_PATH stopped after
 * its first cluster: the mark, then that cluster written and synced.
 */
static void
stop_merge_after_first_cluster (const char *base_path, const char *ov_path)
{
  char cluster[MLOOP_OVERLAY_CLUSTER];
  int fd;

  unit_mark_merging (base_path, ov_path);
  memset (cluster, 0x5a, sizeof cluster);
  fd = open (base_path, O_WRONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pwrite (fd, cluster, sizeof cluster, MERGED_AT) ==
         (ssize_t) sizeof cluster && fsync (fd) == 0 && close (fd) == 0,
         "%s: %s", base_path, strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], moved_path[4096], ov_path[4096], err[1024];
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (moved_path, sizeof moved_path, "%s/moved.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  unit_make_image (base_path, BASE_SIZE);
  unit_write_cluster (base_path, ov_path, MERGED_AT);
  unit_write_cluster (base_path, ov_path, UNMERGED_AT);
  stop_merge_after_first_cluster (base_path, ov_path);

  /* mv to another filesystem: a new file, the old one gone. */
  unit_copy_file (base_path, moved_path);
  CHECK (unlink (base_path) == 0, "unlink: %s", strerror (errno));

  r = unit_try_open_overlay (moved_path, ov_path, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err);
  CHECK (r < 0, "a server took another file for the base of an overlay "
         "whose commit stopped half-way, without being told to");
  CHECK (strstr (err, "half-way") && strstr (err, moved_path) &&
         strstr (err, "--base") && strchr (err, '\n') == NULL,
         "the refusal does not say what to do: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the server dropped the "
         "mark");
  CHECK (mloop_overlay_file_discard (ov_path, err, sizeof err) == -1,
         "the overlay a moved, half-merged base needs was discarded");
  CHECK (access (ov_path, F_OK) == 0, "the overlay was removed");

  /* Committed into the moved file, the merge ends there. */
  r = mloop_overlay_merge (ov_path, moved_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "the commit into the moved base was refused: %s", err);
  CHECK (unit_byte_at (moved_path, UNMERGED_AT) == 0x5a &&
         unit_byte_at (moved_path, MERGED_AT) == 0x5a,
         "the moved base does not hold the overlay");
  CHECK (access (ov_path, F_OK) == -1 && errno == ENOENT,
         "the committed overlay stays");

  printf ("ok: a half-merged base moved away keeps its overlay's mark\n");
  return 0;
}
