/* A commit into a block device that the kernel holds: mounted (read-only
 * to look inside, or read-write), a swap area, a physical volume under
 * device-mapper, an md member.  Each holds the device exclusively (the
 * claim open(O_EXCL) takes); mloop's locks, which only its servers and
 * QEMU take, do not see it.  The commit wrote the overlay's clusters
 * under the mounted filesystem, whose cached metadata no longer matched
 * the disk.  A claim of the commit's own is refused while another
 * holds the device, and keeps a mount off it while the merge writes.
 *
 * Here the test's own O_EXCL open stands for the mount.  Needs root and
 * loop devices (else it skips).  About 0.1 s, in the unit suite of
 * every tier.
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
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

/* Attaches IMAGE to the loop device NODE, detached again when the last
 * descriptor of it closes (the test's, at its exit at the latest).
 * Returns that descriptor.
 */
static int
attach (const char *node, const char *image)
{
  struct loop_config config;
  int fd, file;

  file = open (image, O_RDWR | O_CLOEXEC);
  CHECK (file >= 0, "%s: %s", image, strerror (errno));
  fd = open (node, O_RDWR | O_CLOEXEC);
  CHECK (fd >= 0, "%s: %s", node, strerror (errno));
  memset (&config, 0, sizeof config);
  config.fd = (unsigned) file;
  config.info.lo_flags = LO_FLAGS_AUTOCLEAR;
  /* The last detach may still be finishing. */
  for (int i = 0; ioctl (fd, LOOP_CONFIGURE, &config) == -1; i++) {
    if (errno != EBUSY || i == 100)
      unit_skip ("cannot attach %s to %s: %s", image, node, strerror (errno));
    unit_sleep_ms (20);
  }
  close (file);
  return fd;
}

int
main (void)
{
  const char *dir;
  char image[4096], path[4096], node[64], err[512];
  char *written = NULL;
  int control, n, held, claim;

  if (geteuid () != 0)
    unit_skip ("loop devices need root");
  control = open ("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (control == -1 || (n = ioctl (control, LOOP_CTL_GET_FREE)) < 0)
    unit_skip ("no loop devices: %s", strerror (errno));
  close (control);
  snprintf (node, sizeof node, "/dev/loop%d", n);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (image, sizeof image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a disk");

  held = attach (node, image);
  unit_make_overlay (node, path);
  /* Held as a mount holds it. */
  claim = open (node, O_RDONLY | O_EXCL | O_CLOEXEC);
  CHECK (claim >= 0, "%s: %s", node, strerror (errno));

  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "the commit wrote %s while the kernel held it", node);
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (node, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written into the held device");
  CHECK (access (path, F_OK) == 0, "the overlay was removed");
  CHECK (!unit_still_marks (path, node),
         "the refused commit left its mark, which discard heeds");

  /* Let go: the commit runs. */
  close (claim);
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0, "%s", err);
  free (written);
  CHECK (unit_byte_at (node, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write the device once it was free");
  close (held);
  printf ("ok: a commit refuses a block device the kernel holds\n");
  return 0;
}
