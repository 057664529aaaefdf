/* A commit does not write a base that QEMU has open
 * (engine/overlay_merge.c, engine/fileio.c).  Every QEMU process with
 * an image open, a virtual machine's disk or qemu-img reading it, holds
 * a read lock on byte 100 of it (its "consistent read" permission;
 * bytes 100 to 299 are its lock bytes, one per permission taken or
 * refused to others).  A commit rewrites the base under whoever reads
 * or writes it: its exclusive lock must meet that byte, as it meets
 * mloop's own servers'.
 *
 * Here a descriptor holds the lock QEMU holds, nothing else: the commit
 * must be refused and leave the base as it was; once the lock goes, the
 * commit must run.  No root, no QEMU, no clock: about 0.03 s, in the
 * unit suite of every tier (tests/interop/test-qemu-img.py does it with
 * qemu-io itself).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
/* QEMU's lock byte for the permission every user of an image takes. */
#define QEMU_CONSISTENT_READ_BYTE 100

/* The byte the overlay's cluster goes to in the base, read back. */
static unsigned char
base_byte (const char *path)
{
  unsigned char c = 0;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &c, 1, UNIT_OVERLAY_CLUSTER_AT) == 1,
         "reading %s: %s", path, strerror (errno));
  close (fd);
  return c;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], overlay_path[4096], err[512];
  struct flock qemu = {
    .l_type = F_RDLCK, .l_whence = SEEK_SET,
    .l_start = QEMU_CONSISTENT_READ_BYTE, .l_len = 1,
  };
  int holder, r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (overlay_path, sizeof overlay_path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, overlay_path);

  /* What QEMU holds while it has the image open, for reading or not. */
  holder = open (base_path, O_RDONLY | O_CLOEXEC);
  CHECK (holder >= 0, "%s: %s", base_path, strerror (errno));
  CHECK (fcntl (holder, F_OFD_SETLK, &qemu) == 0, "F_OFD_SETLK: %s",
         strerror (errno));

  r = mloop_overlay_merge (overlay_path, base_path, false, true, err,
                           sizeof err);
  CHECK (r < 0, "a commit wrote the base while QEMU held it");
  CHECK (base_byte (base_path) == 0, "the refused commit wrote the base");
  CHECK (access (overlay_path, F_OK) == 0, "the refused commit removed the "
         "overlay");

  close (holder);
  r = mloop_overlay_merge (overlay_path, base_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "commit once QEMU let go: %s", err);
  CHECK (base_byte (base_path) == 0x5a, "the commit did not write the base");
  return 0;
}
