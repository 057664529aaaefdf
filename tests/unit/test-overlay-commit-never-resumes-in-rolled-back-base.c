/* A commit stopped half-way runs again over its base's changed ends and
 * modification time (the merge changed both), but not into the recorded
 * file rolled back to a version older than the overlay's base
 * (engine/overlay.c, check_base).
 *
 * A snapshot of the base's filesystem put back in its place (an LVM
 * snapshot merged into its origin, `zfs rollback`, a btrfs snapshot
 * mounted where its subvolume was) holds the file with the recorded
 * device or birth, inode and path: by those it is the file the commit
 * wrote.  Taken before the base was last written, it is not the image
 * the overlay was made over, and the commit must not write the
 * overlay's clusters into it, as it never does into a base written
 * since when no commit stopped: a merge only moves the file's
 * modification time forward, so one older than the recorded time is
 * no file the merge wrote.  Nor is it adopted under the mark: only a
 * commit told to (--adopt-base) writes it.
 *
 * The rollback is played by writing the older image's bytes into the
 * base in place and giving it an older modification time.  No root:
 * about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

/* Puts the bytes of an older image into the file at PATH, in place (its
 * first MiB all BYTE), with a modification time an hour before the one
 * it has now: what a snapshot taken before its last write holds.
 */
static void
roll_back (const char *path, int byte)
{
  static char buf[1u << 20];
  struct stat st;
  struct timespec times[2];
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, byte, sizeof buf);
  CHECK (fd >= 0 && fstat (fd, &st) == 0 &&
         pwrite (fd, buf, sizeof buf, 0) == (ssize_t) sizeof buf &&
         fsync (fd) == 0, "%s: %s", path, strerror (errno));
  times[0] = st.st_atim;
  times[1] = st.st_mtim;
  times[1].tv_sec -= 3600;
  CHECK (futimens (fd, times) == 0 && close (fd) == 0, "%s: %s", path,
         strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], ov_path[4096], err[1024];
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  /* A commit stopped half-way, then the base's filesystem rolled back
   * to a snapshot taken before the base was last written.
   */
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, ov_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  roll_back (base_path, 0x11);
  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a stopped commit was resumed into its base rolled back "
         "to a version older than the overlay's base");
  CHECK (strstr (err, "older") != NULL, "the refusal does not say why: %s",
         err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x11,
         "the rolled-back base was written");

  /* Nor adopted under the mark (`mloop overlay adopt`, a server's
   * --overlay-adopt-base): the mark would stay on a version the commit
   * never wrote with that version's older time recorded, and a later
   * rollback to any version between the two would be resumed into.
   */
  r = unit_try_open_overlay (base_path, ov_path, MLOOP_OVERLAY_ADOPT_BASE,
                             err, sizeof err);
  CHECK (r < 0, "a base rolled back under a stopped commit was adopted, "
         "the commit's mark kept on it");
  CHECK (strstr (err, "--adopt-base") != NULL,
         "the refusal does not say what writes it: %s", err);
  CHECK (unit_still_marks (ov_path, base_path),
         "the refused adoption changed the mark");

  /* Said on purpose, it is written. */
  r = mloop_overlay_merge (ov_path, base_path, true, true, err, sizeof err);
  CHECK (r == 0, "--adopt-base did not write the rolled-back base: %s",
         err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "--adopt-base did not write the overlay's cluster");

  /* The stopped commit's own base, its time moved on by the merge,
   * still resumes.
   */
  unit_make_overlay (base_path, ov_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  r = mloop_overlay_merge (ov_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "the stopped commit did not resume in its own base: %s",
         err);

  printf ("ok: a stopped commit never resumes in its base rolled back\n");
  return 0;
}
