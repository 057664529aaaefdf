/* `mloop overlay commit` and `discard` given a symbolic link to the
 * overlay (a stable name such as current.overlay pointing at the file
 * of the day) never report the overlay gone while it stays.
 *
 * Both open the overlay through the link, check that the name still
 * leads to it, and then unlink the name: the link went, and the overlay
 * stayed.  After a commit it stayed with the merge's mark, so discard
 * refused it and advised the commit, which then wrote its old clusters
 * over whatever the base was given since.  After a discard, the writes
 * said to be dropped came back with the next device over it.
 *
 * A hard link is the same: the commit unlinked one name, and the other
 * (a snapshot of the directory by `cp -al`, rsnapshot) kept the
 * overlay, merged and marked.
 *
 * Either may refuse the link or remove the overlay; neither may succeed
 * and leave it.  No root: about 0.05 s.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Whether the overlay is gone or, refused, still unmarked and
 * unmerged: the one outcome that may not be is success with the
 * overlay left behind.
 */
static void
check_not_left (const char *what, int r, const char *path,
                const char *link_path, const char *err)
{
  if (r == 0)
    CHECK (access (path, F_OK) == -1, "%s through the link %s succeeded, "
           "but the overlay %s stayed", what, link_path, path);
  else
    printf ("%s through a link refused: %s\n", what, err);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], link_path[4096], err[1024];
  char *written = NULL;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/day1.overlay", dir);
  snprintf (link_path, sizeof link_path, "%s/current.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);

  unit_make_overlay (base_path, path);
  CHECK (symlink ("day1.overlay", link_path) == 0, "%s: %s", link_path,
         strerror (errno));
  r = mloop_overlay_file_commit (link_path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  check_not_left ("commit", r, path, link_path, err);
  if (r != 0)
    CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) != 0x5a &&
           !unit_still_marks (path, base_path), "the refused commit "
           "wrote the base or marked the overlay");
  unlink (path);
  unlink (link_path);

  unit_make_overlay (base_path, path);
  CHECK (symlink ("day1.overlay", link_path) == 0, "%s: %s", link_path,
         strerror (errno));
  r = mloop_overlay_file_discard (link_path, err, sizeof err);
  check_not_left ("discard", r, path, link_path, err);
  unlink (path);
  unlink (link_path);

  /* A second name: committed or discarded through the first, the
   * overlay must not stay under the second.
   */
  unit_make_overlay (base_path, path);
  CHECK (link (path, link_path) == 0, "%s: %s", link_path, strerror (errno));
  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  check_not_left ("commit", r, link_path, path, err);
  if (r != 0)
    CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) != 0x5a &&
           !unit_still_marks (path, base_path), "the refused commit "
           "wrote the base or marked the overlay");
  unlink (path);
  unlink (link_path);

  unit_make_overlay (base_path, path);
  CHECK (link (path, link_path) == 0, "%s: %s", link_path, strerror (errno));
  r = mloop_overlay_file_discard (path, err, sizeof err);
  check_not_left ("discard", r, link_path, path, err);
  unlink (path);
  unlink (link_path);

  printf ("ok: an overlay named by a link is never reported gone while "
          "it stays\n");
  return 0;
}
