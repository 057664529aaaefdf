/* A commit into a block device that a server holds under another
 * device node of the same disk.  The base's lock (mloop_lock_image, an
 * open file description lock) is the lock of the file it is taken on:
 * for a block device, the node's inode, not the disk.  Two nodes of one
 * disk (`dmsetup mknodes` beside udev's, a container's `--device`
 * node, any mknod) are two files to the lock: a server holding the
 * disk through one does not refuse a commit through the other, which
 * writes under that server's device.
 *
 * Here a child holding the first node open, with the shared lock a
 * file store takes (file_store.c), stands for the server: another
 * process, as the commit looks past its own descriptors.  Needs
 * root, loop devices and a filesystem for device nodes under /var/tmp
 * (else it skips).  About 0.6 s (the commit waits out a brief opener).
 */
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
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
  int held, served, ready[2], r;
  pid_t server;
  char c;

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

  /* A server on the disk through udev's node, its shared lock held
   * until the test ends it.
   */
  CHECK (pipe (ready) == 0, "pipe: %s", strerror (errno));
  server = fork ();
  CHECK (server >= 0, "fork: %s", strerror (errno));
  if (server == 0) {
    prctl (PR_SET_PDEATHSIG, SIGKILL);
    close (held);
    close (ready[0]);
    served = open (node, O_RDONLY | O_CLOEXEC);
    if (served < 0 || mloop_lock_image (served, false) != 0)
      _exit (1);
    if (write (ready[1], "r", 1) != 1)
      _exit (1);
    /* Until the parent ends it, or ends. */
    for (;;)
      pause ();
  }
  close (ready[1]);
  CHECK (read (ready[0], &c, 1) == 1, "the server did not start");

  r = mloop_overlay_merge (path, other, false, true, err, sizeof err);
  CHECK (r < 0, "the commit wrote %s (the disk of %s) while a server held "
         "it through %s", other, node, node);
  printf ("refused: %s\n", err);
  CHECK (unit_byte_at (node, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written under the server");
  kill (server, SIGTERM);
  waitpid (server, NULL, 0);
  close (ready[0]);
  close (held);
  unlink (other);
  printf ("ok: a commit sees a server holding its base under another "
          "node\n");
  return 0;
}
