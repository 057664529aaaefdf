/* A commit into a block device stopped half-way, then the device was
 * given another disk: a loop device detached and attached again to
 * another image (losetup -f picks the first free one), an NBD device
 * connected to another export, /dev/sdb after a reboot that found the
 * disks in another order.  The node at the path is the same file, its
 * inode and device alike (or made again at boot in the same order, with
 * the same number): a node tells nothing of the disk behind it.  The
 * merge's mark let the commit run again over the changed ends of the
 * recorded file, so it wrote the overlay's clusters into the other
 * disk, over its partition table and filesystem.  For a device node,
 * the mark must not excuse other ends: --adopt-base says it is the one.
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
  char first[4096], other[4096], path[4096], node[64], err[512];
  char *written = NULL;
  int held;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (first, sizeof first, "%s/first.img", dir);
  snprintf (other, sizeof other, "%s/other.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (first, BASE_SIZE, "first disk");
  unit_make_tagged_image (other, BASE_SIZE, "another disk");

  held = unit_loop_attach (node, first, false);
  unit_make_overlay (node, path);
  unit_stop_commit (path, node, MLOOP_OVERLAY_MERGE_BASE);
  /* The device given another disk: detached at the last close. */
  CHECK (ioctl (held, LOOP_CLR_FD) == 0 || errno == ENXIO, "%s: %s", node,
         strerror (errno));
  close (held);
  held = unit_loop_attach (node, other, false);

  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "a commit stopped in %s ran again over the other disk now there",
         node);
  printf ("refused: %s\n", err);
  close (held);
  CHECK (unit_byte_at (other, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written into the other disk");
  CHECK (unit_byte_at (other, 0) == 'a', "the other disk's first bytes changed");
  printf ("ok: a stopped commit does not run again in another disk at "
          "its device node\n");
  return 0;
}
