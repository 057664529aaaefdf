/* An overlay made by an older mloop (format version 1) records its
 * base's path as its server was given it, and nothing else of it: a
 * commit checks such a base by its size alone.  Root serves a user's
 * image with such an overlay of root's, the recorded path absolute, in
 * the user's directory; the user replaces the image there with a
 * symbolic link to a file of root's of the same size.  The commit
 * resolved the recorded path (realpath) and wrote the overlay's
 * clusters, the user's writes through the device, into root's file:
 * no identity to refuse it, and the overlay being root's, no owner to
 * ask.  The recorded path must be taken as it is, as a version 2
 * header's is, and a link on it refused; named with --base, the file
 * is written, root's own choice.
 *
 * The overlay here is the caller's, which may name any base, as root's
 * may.  No root: about 0.05 s, in the unit suite of every tier.
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

#define BASE_SIZE (1u << 20)

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
  unit_make_tagged_image (target, BASE_SIZE, "root's own");
  unit_make_tagged_image (image, BASE_SIZE, "the user's");
  unit_make_overlay (image, path);
  unit_make_version_1 (path, image);

  CHECK (unlink (image) == 0 && symlink (target, image) == 0,
         "%s: %s", image, strerror (errno));
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "a commit followed a link put on a version 1 header's path and "
         "wrote %s", written ? written : "(null)");
  printf ("refused: %s\n", err);
  CHECK (strstr (err, "symbolic link") != NULL && strstr (err, "--base"),
         "the refusal does not say why: %s", err);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the file the link led to was written");

  CHECK (mloop_overlay_file_commit (path, image, false, &written, err,
                                    sizeof err) == 0,
         "a commit refused the base --base names: %s", err);
  CHECK (strcmp (written, target) == 0, "the commit wrote %s, not %s",
         written, target);
  free (written);
  CHECK (unit_byte_at (target, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the base --base names does not hold the overlay's clusters");
  printf ("ok: a version 1 header's path is followed through no link\n");
  return 0;
}
