/* The rule that a stopped commit never resumes in its base rolled back
 * (engine/overlay.c, older_than_recorded) orders modification times as
 * times, before 1970 as well.
 *
 * A file's time is signed: ext4, XFS and tmpfs keep times before 1970
 * (an image unpacked from an archive, `touch -d 1969-...`), as negative
 * seconds.  The header keeps them in 64 bits; compared as unsigned, a
 * version from before 1970 is "newer" than any other, so the commit
 * resumed into the base rolled back to such a version, and refused to
 * resume into its own half-merged base when the overlay was made over
 * one.
 *
 * The rollback is played as in
 * test-overlay-commit-never-resumes-in-rolled-back-base.c.  No root:
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
/* 1969-06-01, as a file keeps it. */
#define BEFORE_1970 ((time_t) -18489600)

/* Gives the file at PATH the modification time SEC. */
static void
set_mtime (const char *path, time_t sec)
{
  struct timespec times[2] = {
    { .tv_nsec = UTIME_OMIT }, { .tv_sec = sec, .tv_nsec = 0 },
  };
  struct stat st;

  CHECK (utimensat (AT_FDCWD, path, times, 0) == 0 &&
         stat (path, &st) == 0, "%s: %s", path, strerror (errno));
  if (st.st_mtim.tv_sec != sec)
    unit_skip ("the filesystem under %s keeps no times before 1970", path);
}

/* Puts an older image's bytes into the file at PATH, in place (its
 * first MiB all BYTE), with a time before 1970: a snapshot of a version
 * the file had then.
 */
static void
roll_back_before_1970 (const char *path, int byte)
{
  static char buf[1u << 20];
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, byte, sizeof buf);
  CHECK (fd >= 0 && pwrite (fd, buf, sizeof buf, 0) == (ssize_t) sizeof buf
         && fsync (fd) == 0 && close (fd) == 0, "%s: %s", path,
         strerror (errno));
  set_mtime (path, BEFORE_1970);
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

  /* Rolled back to a version from before 1970: older, refused. */
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, ov_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  roll_back_before_1970 (base_path, 0x11);
  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a stopped commit was resumed into its base rolled back "
         "to a version from before 1970");
  CHECK (strstr (err, "older") != NULL, "the refusal does not say why: %s",
         err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x11,
         "the rolled-back base was written");
  r = mloop_overlay_merge (ov_path, base_path, true, true, err, sizeof err);
  CHECK (r == 0, "--adopt-base did not write the rolled-back base: %s",
         err);

  /* An overlay made over a base from before 1970: its stopped commit,
   * which moved the base's time on to now, resumes.
   */
  set_mtime (base_path, BEFORE_1970);
  unit_make_overlay (base_path, ov_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  r = mloop_overlay_merge (ov_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "a stopped commit over a base from before 1970 did not "
         "resume in its own base: %s", err);

  printf ("ok: the rollback check orders times before 1970 too\n");
  return 0;
}
