/* A commit told to write the recorded base although it was written
 * since (--adopt-base) records the version it begins with, so a stopped
 * commit never resumes in that file rolled back to a version between
 * the overlay's base and the one the commit began writing
 * (engine/overlay.c, mloop_overlay_note_merging and check_base).
 *
 * A stopped commit resumes in its recorded file whatever its ends, but
 * not when its modification time is older than the recorded one: a
 * merge only moves it forward.  That holds only if the recorded time
 * is the one of the version the merge began writing.  A commit with
 * --adopt-base into the recorded file, written since the overlay was
 * made, marked it and kept the overlay's older time: a snapshot of the
 * file's filesystem taken in between (a nightly one), put back to undo
 * the half-done commit, passed as the merge's own work, and the commit
 * wrote the overlay's clusters into an image that is neither the
 * overlay's base nor the one the user told it to write.
 *
 * The versions are played by writes in place and set modification
 * times, all in the past.  No root: about 0.05 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
/* In the middle: the ends, and so the fingerprint, stay as they were. */
#define WRITTEN_AT (2u << 20)

/* Writes 4 KiB of BYTE at WRITTEN_AT of the file at PATH in place and
 * gives it the modification time AGO seconds before now.
 */
static void
write_version (const char *path, int byte, time_t ago)
{
  char buf[4096];
  struct timespec times[2] = {
    { .tv_nsec = UTIME_OMIT }, { .tv_sec = time (NULL) - ago },
  };
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, byte, sizeof buf);
  CHECK (fd >= 0 && pwrite (fd, buf, sizeof buf, WRITTEN_AT) ==
         (ssize_t) sizeof buf && fsync (fd) == 0 &&
         futimens (fd, times) == 0 && close (fd) == 0, "%s: %s", path,
         strerror (errno));
}

/* Puts back the version written two hours ago, as a snapshot of that
 * time holds it: the overlay's cluster not yet merged.
 */
static void
roll_back (const char *path)
{
  char zero[4096] = { 0 };
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, zero, sizeof zero, UNIT_OVERLAY_CLUSTER_AT)
         == (ssize_t) sizeof zero && close (fd) == 0, "%s: %s", path,
         strerror (errno));
  write_version (path, 0x22, 2 * 3600);
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

  /* The overlay made over the base as it was three hours ago; the base
   * written two hours ago (a snapshot keeps that version), and again an
   * hour ago.
   */
  unit_make_image (base_path, BASE_SIZE);
  write_version (base_path, 0x00, 3 * 3600);
  unit_make_overlay (base_path, ov_path);
  write_version (base_path, 0x22, 2 * 3600);
  write_version (base_path, 0x33, 3600);
  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a commit wrote a base written since without --adopt-base");

  /* Told to write it all the same, the commit stops half-way; the
   * snapshot of two hours ago is put back in its place.
   */
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_ANY_BASE);
  roll_back (base_path);

  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a stopped commit was resumed into its base rolled back "
         "to a version older than the one it began writing");
  CHECK (strstr (err, "older") != NULL, "the refusal does not say why: %s",
         err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x00,
         "the rolled-back base was written");

  /* Said on purpose again, it is written. */
  r = mloop_overlay_merge (ov_path, base_path, true, true, err, sizeof err);
  CHECK (r == 0, "--adopt-base did not write the rolled-back base: %s",
         err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "--adopt-base did not write the overlay's cluster");

  /* A commit stopped after --adopt-base began it still resumes in the
   * version it wrote, its time moved on by the merge.
   */
  write_version (base_path, 0x00, 3 * 3600);
  unit_make_overlay (base_path, ov_path);
  write_version (base_path, 0x44, 1800);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_ANY_BASE);
  r = mloop_overlay_merge (ov_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "the stopped commit did not resume in the version it "
         "began writing: %s", err);
  CHECK (access (ov_path, F_OK) == -1, "the resumed commit left the overlay");

  printf ("ok: a commit begun with --adopt-base never resumes in an older "
          "version\n");
  return 0;
}
