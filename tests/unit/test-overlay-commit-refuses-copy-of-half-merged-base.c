/* A commit stopped half-way has its mark on the recorded base, which
 * holds part of the overlay already.  A copy of the base made before
 * that commit keeps the first and last MiB the overlay recorded, so it
 * passes the identity check; committed into it with --base, or served
 * as the overlay's base, it was recorded as the base with the mark, and
 * the original stayed half-merged with nothing marking it (discard
 * would then remove the overlay and its clusters).  While the recorded
 * file is still at its recorded path, both must be refused in one line
 * naming it, the header left recording it with its mark, the copy left
 * unwritten; an explicit adoption (--adopt-base) still writes the copy.
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

  r = mloop_overlay_merge (ov_path, copy_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a commit into a copy was taken while the base it stopped "
         "half-way in is still at its path");
  CHECK (strstr (err, base_path) != NULL && strstr (err, "half-way") &&
         strstr (err, "--adopt-base") && strchr (err, '\n') == NULL,
         "the refusal does not name the half-merged base: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the mark left the half-merged "
         "base");
  CHECK (unit_byte_at (copy_path, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the copy was written");

  r = unit_try_open_overlay (copy_path, ov_path, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err);
  CHECK (r < 0, "a server took a copy of the base a commit stopped "
         "half-way in");
  CHECK (strstr (err, base_path) != NULL && strstr (err, "half-way"),
         "the server's refusal does not name the half-merged base: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the server moved the mark");

  /* Moved on purpose: the copy is written and marked. */
  r = mloop_overlay_merge (ov_path, copy_path, true, false, err, sizeof err);
  CHECK (r == 0, "--adopt-base no longer writes the copy: %s", err);
  CHECK (unit_byte_at (copy_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the adopted copy was not written");

  printf ("ok: a copy of a half-merged base is refused unless adopted\n");
  return 0;
}
