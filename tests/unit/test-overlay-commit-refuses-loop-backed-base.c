/* A commit into an image file that a loop device is attached to:
 * `mount -o loop,ro base.img /mnt` to look inside the base, or a
 * `losetup` left over.  The loop driver holds the file open but takes
 * no lock, so the image lock did not see it, and the commit wrote the
 * overlay's clusters under the mounted filesystem, whose cached
 * metadata then no longer matched its image.  The commit refuses an
 * image a loop device is attached to, naming the device.
 *
 * Needs root and loop devices (else it skips).  About 0.1 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/loop.h>

#include "overlay.h"
#include "overlay_file.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

int
main (void)
{
  const char *dir;
  char image[4096], path[4096], node[64], backing[128], err[512];
  char *written = NULL;
  int n, held;

  n = unit_free_loop (node, sizeof node);
  snprintf (backing, sizeof backing, "/sys/block/loop%d/loop/backing_file",
            n);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (image, sizeof image, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a base");
  unit_make_overlay (image, path);

  held = unit_loop_attach (node, image, true);
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "the commit wrote %s under %s", image, node);
  printf ("refused: %s\n", err);
  CHECK (strstr (err, node) != NULL, "the refusal does not name %s", node);
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written under the loop device");
  CHECK (access (path, F_OK) == 0, "the overlay was removed");
  CHECK (!unit_still_marks (path, image),
         "the refused commit left its mark, which discard heeds");

  /* Detached: the commit runs. */
  CHECK (ioctl (held, LOOP_CLR_FD) == 0 || errno == ENXIO, "%s: %s", node,
         strerror (errno));
  close (held);
  for (int i = 0; access (backing, F_OK) == 0; i++) {
    CHECK (i < 100, "%s stays attached", node);
    unit_sleep_ms (20);
  }
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0, "%s", err);
  free (written);
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write the image once it was free");
  printf ("ok: a commit refuses an image a loop device is attached to\n");
  return 0;
}
