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
#include <unistd.h>

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
  char image[4096], path[4096], node[64], err[512];
  char *written = NULL;
  int held, claim;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (image, sizeof image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a disk");

  held = unit_loop_attach (node, image, false);
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
