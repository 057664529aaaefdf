/* A commit into a block device that a server holds under another
 * device node of the same disk.  The base's lock (mloop_lock_image, an
 * open file description lock) is the lock of the file it is taken on:
 * for a block device, the node's inode, not the disk.  Two nodes of one
 * disk (`dmsetup mknodes` beside udev's, a container's `--device`
 * node, any mknod) are two files to the lock: a server holding the
 * disk through one does not refuse a commit through the other, which
 * writes under that server's device.
 *
 * Here the test's own shared lock on the first node stands for the
 * server (it is the lock a file store takes, file_store.c).  Needs
 * root, loop devices and a filesystem for device nodes under /var/tmp
 * (else it skips).  About 0.1 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "fileio.h"
#include "overlay.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

int
main (void)
{
  const char *dir;
  char image[4096], path[4096], other[4096], node[64], err[512];
  struct stat st;
  int held, served, r;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (image, sizeof image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (other, sizeof other, "%s/disk-node", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a disk");

  held = unit_loop_attach (node, image, false);
  CHECK (stat (node, &st) == 0, "%s: %s", node, strerror (errno));
  /* A second node of the same disk. */
  CHECK (mknod (other, S_IFBLK | 0600, st.st_rdev) == 0, "mknod %s: %s",
         other, strerror (errno));
  unit_make_overlay (other, path);

  /* A server on the disk through udev's node: its shared lock. */
  served = open (node, O_RDONLY | O_CLOEXEC);
  CHECK (served >= 0, "%s: %s", node, strerror (errno));
  CHECK (mloop_lock_image (served, false) == 0, "the server's lock");

  r = mloop_overlay_merge (path, other, false, true, err, sizeof err);
  CHECK (r < 0, "the commit wrote %s (the disk of %s) while a server held "
         "it through %s", other, node, node);
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (node, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written under the server");
  close (served);
  close (held);
  unlink (other);
  printf ("ok: a commit sees a server holding its base under another "
          "node\n");
  return 0;
}
