/* Root serves a user's image with an overlay of root's, and later
 * commits it.  The header records the image's canonical path, in the
 * user's directory: the user replaces the image there with a symbolic
 * link to a file of root's they may read, their image having been a
 * copy of it (same size, same first and last MiB).  Following the link,
 * the commit found a copy of the base by its content and wrote the
 * overlay's clusters, the user's writes through the device, into root's
 * file.  The recorded path must be taken as it is, a link on it
 * refused; and the merge itself refuses a base path with a link on it
 * (one swapped in after the path was resolved).  Named with --base, the
 * file is written: that is root's own choice.  Nor is a header's
 * relative path resolved from wherever the commit runs.
 *
 * The overlay here is the caller's, which may name any base, as root's
 * may.  No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Makes the header of the overlay at PATH name its base as NAME. */
static void
record_path (const char *path, const char *name)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, name, strlen (name) + 1, 64) ==
         (ssize_t) strlen (name) + 1 && close (fd) == 0, "%s: %s", path,
         strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char user_dir[2048], image[4096], target[4096], path[4096], err[512];
  char *written = NULL;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (user_dir, sizeof user_dir, "%s/user", dir);
  snprintf (image, sizeof image, "%s/image.img", user_dir);
  snprintf (target, sizeof target, "%s/root.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  CHECK (mkdir (user_dir, 0700) == 0, "%s: %s", user_dir, strerror (errno));
  unit_make_tagged_image (target, BASE_SIZE, "template");
  unit_make_tagged_image (image, BASE_SIZE, "template");
  unit_make_overlay (image, path);

  CHECK (unlink (image) == 0 && symlink (target, image) == 0,
         "%s: %s", image, strerror (errno));
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "a commit followed a link put on the recorded path and wrote %s",
         written ? written : "(null)");
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the file the link led to was written");

  CHECK (mloop_overlay_merge (path, image, false, true, err, sizeof err) < 0,
         "a merge wrote through a link on the base's path");
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the file the link led to was written");

  /* A relative path, resolved from where root's commit runs. */
  record_path (path, "root.img");
  CHECK (chdir (dir) == 0, "%s: %s", dir, strerror (errno));
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "a commit resolved a relative base path from its directory and "
         "wrote %s", written ? written : "(null)");
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the file the relative path named was written");

  CHECK (mloop_overlay_file_commit (path, image, false, &written, err,
                                    sizeof err) == 0,
         "a commit refused the base --base names: %s", err);
  CHECK (strcmp (written, target) == 0, "the commit wrote %s, not %s",
         written, target);
  free (written);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the base --base names does not hold the overlay's clusters");
  printf ("ok: a commit writes through no link put on the base's path\n");
  return 0;
}
