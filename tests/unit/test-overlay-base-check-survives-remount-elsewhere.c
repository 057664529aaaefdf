/* An overlay's base is still its recorded file when its filesystem
 * comes back under another device number at another place (a USB
 * disk's mount point named anew, an NFS export mounted elsewhere):
 * neither the recorded device nor the recorded path finds it then,
 * but its inode and birth time do (engine/overlay.c, recorded_file).
 * Taken for a copy of itself, such a base written since in its middle
 * (another overlay committed into it) would go by its first and last
 * MiB alone and be served, its new times recorded so that the write
 * was never seen again; and a commit stopped half-way in it would lose
 * its mark once the base was adopted, letting discard leave the base
 * half-merged.
 *
 * The remount is played by a rename (another path) and another device
 * number written into the header.  Skipped where the filesystem keeps
 * no birth times.  No root: about 0.05 s, in the unit suite of every
 * tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
#define INSIDE (2u << 20)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], moved_path[4096], a_path[4096], b_path[4096];
  char c_path[4096], err[1024];
  const struct timespec long_ago[2] = { { 1000000000, 0 },
                                        { 1000000000, 0 } };
  struct statx stx;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (moved_path, sizeof moved_path, "%s/elsewhere.img", dir);
  snprintf (a_path, sizeof a_path, "%s/a.overlay", dir);
  snprintf (b_path, sizeof b_path, "%s/b.overlay", dir);
  snprintf (c_path, sizeof c_path, "%s/c.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  if (statx (AT_FDCWD, base_path, 0, STATX_BTIME, &stx) != 0 ||
      !(stx.stx_mask & STATX_BTIME) || stx.stx_btime.tv_sec == 0)
    unit_skip ("%s keeps no birth times", dir);
  /* Set back, so the commit's write shows whatever the clock's grain. */
  CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0, "utimensat: %s",
         strerror (errno));
  unit_make_empty_overlay (base_path, b_path);
  /* A commit into the base stopped half-way. */
  unit_make_empty_overlay (base_path, c_path);
  unit_mark_merging (base_path, c_path);

  /* The base's filesystem mounted again, elsewhere. */
  CHECK (rename (base_path, moved_path) == 0, "rename: %s", strerror (errno));
  unit_renumber_base_device (b_path);
  unit_renumber_base_device (c_path);

  /* Written since in its middle, by another overlay's commit. */
  unit_write_cluster (moved_path, a_path, INSIDE);
  r = mloop_overlay_merge (a_path, moved_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit of A: %s", err);
  r = unit_try_open_overlay (moved_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r < 0, "overlay B was served over its base written since, its "
         "filesystem mounted elsewhere under another device number");
  CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
         "why: %s", err);

  /* Adopting the base keeps the stopped commit's mark, which discard
   * heeds.
   */
  CHECK (mloop_overlay_adopt (c_path, moved_path, err, sizeof err) == 0,
         "adopt: %s", err);
  CHECK (mloop_overlay_file_discard (c_path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded once its "
         "base, mounted elsewhere, was adopted");
  CHECK (access (c_path, F_OK) == 0, "the half-committed overlay was "
         "removed");

  printf ("ok: the base is its recorded file mounted elsewhere\n");
  return 0;
}
