/* An overlay's base is still its recorded file when the filesystem
 * holding it comes back under another device number (engine/overlay.c,
 * recorded_file).  Device numbers are not the file's: NFS and btrfs
 * number their mounts as they are made, device-mapper and USB disks
 * theirs as they appear, so after a reboot or a remount the same file
 * may show another st_dev.  Were the device number part of "the same
 * file", such a base written since (another overlay committed into
 * it) would be taken for a copy of itself, go by its first and last MiB
 * alone, be served, and have its new times recorded: the overlay would
 * show the base's new bytes under its own filesystem metadata from
 * before.  And a commit stopped half-way in it would lose its mark once
 * the base was adopted or served, letting discard leave the base
 * half-merged.
 *
 * The remount is played by writing another device number into the
 * header, as the next boot would find it.  No root: about 0.05 s, in
 * the unit suite of every tier.
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
  char base_path[4096], a_path[4096], b_path[4096], c_path[4096];
  char err[1024];
  const struct timespec long_ago[2] = { { 1000000000, 0 },
                                        { 1000000000, 0 } };
  struct stat st;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (a_path, sizeof a_path, "%s/a.overlay", dir);
  snprintf (b_path, sizeof b_path, "%s/b.overlay", dir);
  snprintf (c_path, sizeof c_path, "%s/c.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (stat (base_path, &st) == 0, "%s: %s", base_path, strerror (errno));

  /* Not written since: served, and the new number recorded. */
  unit_make_empty_overlay (base_path, b_path);
  unit_renumber_base_device (b_path);
  r = unit_try_open_overlay (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r == 0, "overlay B over its unchanged base: %s", err);
  CHECK (unit_get_u64 (b_path, UNIT_HDR_BASE_DEV) == (uint64_t) st.st_dev,
         "the base's new device number was not recorded");

  /* Written since in its middle, by another overlay's commit: the
   * times set back first, so the commit's write shows whatever the
   * clock's grain.
   */
  CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0, "utimensat: %s",
         strerror (errno));
  unlink (b_path);
  unit_make_empty_overlay (base_path, b_path);
  unit_write_cluster (base_path, a_path, INSIDE);
  r = mloop_overlay_merge (a_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit of A: %s", err);
  unit_renumber_base_device (b_path);
  r = unit_try_open_overlay (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r < 0, "overlay B was served over its base written since, its "
         "filesystem under another device number");
  CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
         "why: %s", err);
  r = mloop_overlay_merge (b_path, base_path, false, false, err, sizeof err);
  CHECK (r < 0, "overlay B was committed over its base written since, its "
         "filesystem under another device number");

  /* A commit stopped half-way, then a reboot: adopting the base keeps
   * the mark, which discard heeds.
   */
  unit_make_empty_overlay (base_path, c_path);
  unit_mark_merging (base_path, c_path);
  unit_renumber_base_device (c_path);
  CHECK (mloop_overlay_adopt (c_path, base_path, err, sizeof err) == 0,
         "adopt: %s", err);
  CHECK (mloop_overlay_file_discard (c_path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded once its "
         "base, under another device number, was adopted");
  CHECK (access (c_path, F_OK) == 0, "the half-committed overlay was "
         "removed");

  printf ("ok: the base is its recorded file under another device number\n");
  return 0;
}
