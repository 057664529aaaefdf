/* A commit stopped half-way has its mark on the recorded base.  While
 * that file is still at its recorded path, a copy of the base (keeping
 * the ends the overlay recorded) must be refused, committed into with
 * --base or served: recorded in its place it would take the mark, and
 * the half-merged file keep nothing saying so, which discard would
 * then leave so.  The file at the recorded path is the recorded one by
 * its inode there, whatever device number its filesystem has now: NFS
 * numbers its mounts as they are made, device-mapper disks theirs as
 * they appear, and NFS on Debian 12's kernel keeps no birth time.  The
 * check looked for the recorded device, or a birth both know, and
 * never at the path it had just looked the file up by: after such a
 * remount the copy was committed into and took the mark.
 *
 * The remount is played by writing another device number into the
 * header, and a filesystem keeping no birth time by clearing the one
 * recorded.  No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], copy_path[4096], ov_path[4096], err[1024];
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (copy_path, sizeof copy_path, "%s/copy.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, ov_path);
  unit_copy_file (base_path, copy_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  unit_renumber_base_device (ov_path);
  unit_put_u64 (ov_path, UNIT_HDR_BASE_BIRTH, 0);

  r = mloop_overlay_merge (ov_path, copy_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a commit into a copy was taken while the base it stopped "
         "half-way in is still at its path, under another device number");
  CHECK (strstr (err, base_path) != NULL && strstr (err, "half-way"),
         "the refusal does not name the half-merged base: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the mark left the half-merged "
         "base");
  CHECK (unit_byte_at (copy_path, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the copy was written");

  r = unit_try_open_overlay (copy_path, ov_path, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err);
  CHECK (r < 0, "a server took a copy of the base a commit stopped "
         "half-way in, its filesystem under another device number");
  CHECK (strstr (err, base_path) != NULL && strstr (err, "half-way"),
         "the server's refusal does not name the half-merged base: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the server moved the mark");

  printf ("ok: a half-merged base at its path is known after a remount\n");
  return 0;
}
