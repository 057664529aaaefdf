/* A commit moved on purpose to another image (commit --adopt-base) that
 * is dated later than the clock resumes there after a stop, although
 * the overlay carried the mark of an earlier commit stopped in the
 * image it was made for.
 *
 * A merge beginning in a base dated ahead of the clock sets that base's
 * time to now first, so that its own writes, which set the time to now,
 * are not older than the time recorded with its mark.  That was skipped
 * whenever the header showed a mark, taken for a merge that had begun
 * in this very file; but the mark may be another file's.  Recorded
 * with its time to come, the new image was then found "older than the
 * overlay recorded" after its own commit's first write: resuming was
 * refused as a snapshot put back, and so was adopting it.
 *
 * No root: about 0.05 s.
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
/* A year ahead of the clock. */
#define AHEAD ((time_t) 365 * 24 * 3600)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], other_path[4096], ov_path[4096], err[1024];
  struct timespec times[2] = {
    { .tv_nsec = UTIME_OMIT }, { .tv_sec = time (NULL) + AHEAD },
  };
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (other_path, sizeof other_path, "%s/other.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  unit_make_tagged_image (base_path, BASE_SIZE, "base");
  unit_make_overlay (base_path, ov_path);
  /* A commit into the image it was made for, stopped half-way. */
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  /* The owner moves the commit to another image, dated ahead of the
   * clock, and that commit stops too after its first write.
   */
  unit_make_tagged_image (other_path, BASE_SIZE, "other");
  CHECK (utimensat (AT_FDCWD, other_path, times, 0) == 0, "%s: %s",
         other_path, strerror (errno));
  unit_stop_commit (ov_path, other_path, MLOOP_OVERLAY_MERGE_ANY_BASE);
  CHECK (unit_still_marks (ov_path, other_path), "the commit into %s left "
         "no mark naming it", other_path);

  r = mloop_overlay_adopt (ov_path, other_path, err, sizeof err);
  CHECK (r == 0, "the image a stopped commit wrote, dated ahead of the "
         "clock when it began, was refused for adoption: %s", err);
  r = mloop_overlay_merge (ov_path, other_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "a stopped commit did not resume in the image it was "
         "moved to, dated ahead of the clock when it began: %s", err);
  CHECK (unit_byte_at (other_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the image does not hold the overlay");
  CHECK (access (ov_path, F_OK) == -1, "the committed overlay stayed");

  printf ("ok: a commit moved to an image dated ahead of the clock "
          "resumes there\n");
  return 0;
}
