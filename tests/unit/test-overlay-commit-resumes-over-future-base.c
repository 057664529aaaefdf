/* A stopped commit resumes in its own base whose modification time was
 * later than the clock when the commit began: an image unpacked or
 * copied with its times (tar, rsync -a) from a machine whose clock ran
 * ahead, or `touch -d` a date to come.
 *
 * The merge's first write sets the base's time to now, earlier than
 * the one recorded, and a stopped commit then found the base "older
 * than the overlay recorded": refused as a snapshot put back, and
 * adopting it refused the same way, though it is the very version the
 * commit wrote.  Only --adopt-base got past it, on a false reason.
 *
 * The commit is stopped as the fixture stops one (its mark, then a
 * write into the base).  No root: about 0.05 s, in the unit suite of
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
/* A year ahead of the clock. */
#define AHEAD ((time_t) 365 * 24 * 3600)

/* Gives the file at PATH a modification time AHEAD of the clock. */
static void
date_ahead (const char *path)
{
  struct timespec times[2] = {
    { .tv_nsec = UTIME_OMIT }, { .tv_sec = time (NULL) + AHEAD },
  };

  CHECK (utimensat (AT_FDCWD, path, times, 0) == 0, "%s: %s", path,
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

  unit_make_image (base_path, BASE_SIZE);
  date_ahead (base_path);
  unit_make_overlay (base_path, ov_path);
  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);

  /* Adopting it is not needed, and must not be refused either. */
  r = mloop_overlay_adopt (ov_path, base_path, err, sizeof err);
  CHECK (r == 0, "the base a stopped commit wrote, dated ahead of the "
         "clock when it began, was refused for adoption: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "adopting the half-merged "
         "base dropped the merge's mark");
  r = mloop_overlay_merge (ov_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "a stopped commit did not resume in its own base, dated "
         "ahead of the clock when it began: %s", err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the base does not hold the overlay");
  CHECK (access (ov_path, F_OK) == -1, "the committed overlay stayed");

  /* An empty overlay's commit writes nothing, and leaves the base's
   * time as it was: other overlays over it still take it.
   */
  {
    struct stat before, after;

    date_ahead (base_path);
    unit_make_empty_overlay (base_path, ov_path);
    CHECK (stat (base_path, &before) == 0, "%s: %s", base_path,
           strerror (errno));
    r = mloop_overlay_merge (ov_path, base_path, false, true, err,
                             sizeof err);
    CHECK (r == 0, "an empty overlay was not committed: %s", err);
    CHECK (stat (base_path, &after) == 0 &&
           after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
           after.st_mtim.tv_nsec == before.st_mtim.tv_nsec,
           "committing an empty overlay changed its base's time");
  }

  printf ("ok: a stopped commit resumes in a base dated ahead of the "
          "clock\n");
  return 0;
}
