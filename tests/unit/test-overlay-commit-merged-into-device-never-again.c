/* A commit into a block device that merged every cluster but could not
 * remove the overlay leaves an overlay whose clusters are in the base
 * already.  A file base shows it was written since (its times); a
 * block device does not (its fingerprint covers only its ends, and a
 * device node's times do not follow its writes), so a later commit of
 * that overlay would write its old clusters over whatever the device
 * holds by then.  The overlay must say it was merged: every later use
 * but discard refuses it.
 *
 * Needs root, loop devices and chattr on an ext4 /var/tmp (else it
 * skips).  About 0.1 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commit_fixture.h"
#include "overlay.h"
#include "overlay_file.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
/* In the middle: outside the fingerprint of either end. */
#define MIDDLE (BASE_SIZE / 2)

int
main (void)
{
  const char *dir;
  char image[4096], sub[4096], path[8192], node[64], err[512];
  unsigned char newer[MLOOP_OVERLAY_CLUSTER];
  char *written = NULL;
  int held, fd, r;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (image, sizeof image, "%s/disk.img", dir);
  snprintf (sub, sizeof sub, "%s/overlays", dir);
  snprintf (path, sizeof path, "%s/overlay", sub);
  CHECK (mkdir (sub, 0755) == 0, "%s: %s", sub, strerror (errno));
  unit_make_tagged_image (image, BASE_SIZE, "a disk");
  held = unit_loop_attach (node, image, false);
  unit_write_cluster (node, path, MIDDLE);

  /* Merged, not removed: the overlay's directory is append-only. */
  unit_commit_unremoved (path, sub, err, sizeof err);
  CHECK (unit_byte_at (node, MIDDLE) == 0x5a, "the commit did not merge");

  /* The device written on its own since. */
  memset (newer, 0x77, sizeof newer);
  fd = open (node, O_WRONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pwrite (fd, newer, sizeof newer, MIDDLE) ==
         (ssize_t) sizeof newer && fsync (fd) == 0 && close (fd) == 0,
         "%s: %s", node, strerror (errno));

  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  printf ("commit again: %d: %s\n", r, r ? err : "ok");
  printf ("the device's cluster now: 0x%02x (0x77 written since)\n",
          unit_byte_at (node, MIDDLE));
  CHECK (unit_byte_at (node, MIDDLE) == 0x77,
         "a second commit wrote the merged overlay's old cluster again");
  CHECK (r == -1 && strstr (err, "committed") != NULL,
         "a second commit was not refused as committed already");
  r = mloop_overlay_file_discard (path, err, sizeof err);
  printf ("discard: %d: %s\n", r, r ? err : "ok");
  CHECK (r == 0 && access (path, F_OK) == -1 && errno == ENOENT,
         "discard did not remove the merged overlay");
  close (held);
  printf ("ok: an overlay merged into a device is never merged again\n");
  return 0;
}
