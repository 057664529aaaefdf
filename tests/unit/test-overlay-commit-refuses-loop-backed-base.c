/* A commit into an image file that a loop device is attached to:
 * `mount -o loop,ro base.img /mnt` to look inside the base, or a
 * `losetup` left over.  The loop driver holds the file open but takes
 * no lock, so the image lock did not see it, and the commit wrote the
 * overlay's clusters under the mounted filesystem, whose cached
 * metadata then no longer matched its image.  The commit refuses an
 * image a loop device is attached to, naming the device; also when the
 * name the loop device was given is gone (a hard link removed: its
 * sysfs path then leads nowhere), and a block device base a loop device
 * is attached to (a loop device over a disk, to mount a partition of
 * it: the mount claims the loop device, not the disk).
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

  /* Attached by another name of the image, that name removed since. */
  {
    char other[4096], gone[4096];
    int held2;

    snprintf (other, sizeof other, "%s/other.img", dir);
    snprintf (gone, sizeof gone, "%s/gone.img", dir);
    unit_make_tagged_image (other, BASE_SIZE, "another base");
    unit_make_overlay (other, path);
    CHECK (link (other, gone) == 0, "%s: %s", gone, strerror (errno));
    unit_free_loop (node, sizeof node);
    held2 = unit_loop_attach (node, gone, true);
    CHECK (unlink (gone) == 0, "%s: %s", gone, strerror (errno));
    CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                      sizeof err) == -1,
           "the commit wrote %s under %s, attached by a removed name",
           other, node);
    CHECK (unit_byte_at (other, UNIT_OVERLAY_CLUSTER_AT) == 0,
           "the clusters were written under %s", node);
    printf ("refused: %s\n", err);
    close (held2);
  }

  /* A loop device over a block device base. */
  {
    char disk_image[4096], disk[64], over[64];
    int disk_fd, over_fd;

    snprintf (disk_image, sizeof disk_image, "%s/disk.img", dir);
    snprintf (path, sizeof path, "%s/disk.overlay", dir);
    unit_make_tagged_image (disk_image, BASE_SIZE, "a disk");
    unit_free_loop (disk, sizeof disk);
    disk_fd = unit_loop_attach (disk, disk_image, false);
    unit_make_overlay (disk, path);
    unit_free_loop (over, sizeof over);
    over_fd = unit_loop_attach (over, disk, true);
    CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                      sizeof err) == -1,
           "the commit wrote %s under the loop device %s over it", disk,
           over);
    CHECK (strstr (err, over) != NULL, "the refusal does not name %s: %s",
           over, err);
    CHECK (unit_byte_at (disk_image, UNIT_OVERLAY_CLUSTER_AT) == 0,
           "the clusters were written under %s", over);
    printf ("refused: %s\n", err);
    close (over_fd);
    close (disk_fd);
  }
  printf ("ok: a commit refuses an image a loop device is attached to\n");
  return 0;
}
