/* A commit into a partition that shares bytes with another partition of
 * its disk.  Partition tables may nest them: a hybrid ISO written to a
 * USB stick (the whole ISO as partition 1 from sector 0, its EFI image
 * as partition 2 inside it), a BSD disklabel's partitions inside their
 * MBR slice.  A mount of the inner one (here a read-only loop device
 * over it, or an O_EXCL claim as a mount takes) claims nothing of the
 * outer one, nor is it a loop device over the base, its disk or a
 * partition of the base: the claim, the loop check and the openers'
 * scan all let the commit write under it.
 *
 * Here: disk.img with partition 1 from sector 8 to the end and
 * partition 2, 1 MiB, inside it; the overlay over partition 1.  Its
 * cluster lies outside partition 2, but the commit is refused for as
 * long as anything holds partition 2, as it is for a holder of the disk.
 *
 * Needs root, loop devices and a kernel that reads MBR partition tables
 * (else it skips).  About 0.5 s.
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/loop.h>

#include "overlay.h"
#include "overlay_file.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define DISK_SIZE (8u << 20)

/* Writes an MBR with partition 1 over sectors [8, end) and partition 2
 * over [2048, 4096), inside it.
 */
static void
write_nested_mbr (const char *image)
{
  const uint32_t starts[2] = { 8, 2048 };
  const uint32_t sectors[2] = { DISK_SIZE / 512 - 8, 2048 };
  unsigned char mbr[512];
  int fd = open (image, O_RDWR | O_CLOEXEC);

  CHECK (fd >= 0, "%s: %s", image, strerror (errno));
  CHECK (pread (fd, mbr, sizeof mbr, 0) == sizeof mbr, "read MBR");
  memset (mbr + 446, 0, 64);
  for (int i = 0; i < 2; i++) {
    unsigned char *e = mbr + 446 + 16 * i;

    e[4] = i == 0 ? 0x83 : 0xef;
    memcpy (e + 8, &starts[i], 4);
    memcpy (e + 12, &sectors[i], 4);
  }
  mbr[510] = 0x55;
  mbr[511] = 0xaa;
  CHECK (pwrite (fd, mbr, sizeof mbr, 0) == sizeof mbr, "write MBR");
  close (fd);
}

static void
wait_for (const char *node)
{
  struct stat st;

  for (int i = 0; stat (node, &st) == -1; i++) {
    if (i == 100)
      unit_skip ("%s did not appear", node);
    unit_sleep_ms (20);
  }
}

/* Commits PATH: whether it was refused (the reason printed). */
static bool
refused (const char *path, const char *holder)
{
  char err[512], *written = NULL;
  int r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                     sizeof err);

  free (written);
  if (r == 0)
    printf ("NOT refused: committed under %s\n", holder);
  else
    printf ("refused under %s: %s\n", holder, err);
  return r != 0;
}

int
main (void)
{
  const char *dir;
  char disk_image[4096], path[4096], disk[64], outer[80], inner[80],
    over[64];
  int disk_fd, over_fd, claim_fd;
  bool failed = false;

  unit_free_loop (disk, sizeof disk);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (disk_image, sizeof disk_image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/outer.overlay", dir);
  unit_make_tagged_image (disk_image, DISK_SIZE, "a disk");
  write_nested_mbr (disk_image);
  disk_fd = unit_loop_attach_flags (disk, disk_image, LO_FLAGS_PARTSCAN);
  snprintf (outer, sizeof outer, "%sp1", disk);
  snprintf (inner, sizeof inner, "%sp2", disk);
  wait_for (outer);
  wait_for (inner);

  /* A loop device over the inner partition (a loop mount of the EFI
   * image to look inside it).
   */
  unit_free_loop (over, sizeof over);
  over_fd = unit_loop_attach (over, inner, true);
  unit_make_overlay (outer, path);
  failed |= !refused (path, "a loop device over the partition inside it");
  close (over_fd);

  /* The inner partition claimed, as its mount claims it (this process's
   * own claim: the openers' scan never looks at the committing process).
   */
  claim_fd = open (inner, O_RDONLY | O_EXCL | O_CLOEXEC);
  CHECK (claim_fd >= 0, "%s: %s", inner, strerror (errno));
  if (access (path, F_OK) == -1)
    unit_make_overlay (outer, path);
  failed |= !refused (path, "a claim of the partition inside it");
  close (claim_fd);

  failed |= unit_byte_at (disk_image, 4096 + UNIT_OVERLAY_CLUSTER_AT) == 0x5a;
  close (disk_fd);
  CHECK (!failed, "a commit wrote a partition under a holder of another "
         "partition sharing its bytes");
  printf ("ok\n");
  return 0;
}
