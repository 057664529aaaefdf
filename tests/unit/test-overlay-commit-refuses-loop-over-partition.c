/* A commit into a block device while a loop device is attached to one
 * of its partitions (`mount -o loop,ro /dev/sdb1 /mnt`, `losetup -r
 * /dev/loopN /dev/sdb1` to look inside a VM disk's first partition), or
 * to the whole disk of a partition base: the loop driver claims
 * nothing, the partition is not claimed, so the O_EXCL claim of the
 * disk succeeds, and a loop check comparing only the exact device
 * number does not see it: the commit would write under the loop
 * device's filesystem.
 *
 * Here: disk.img with one partition, attached with partscan as the
 * base (/dev/loopA, /dev/loopAp1); a second loop device over
 * /dev/loopAp1, read-only (standing in for the mount); an overlay over
 * /dev/loopA whose one cluster lies inside the partition.  Then the
 * partition as the base, a loop device over the whole disk: refused;
 * and over the disk's first 4 KiB only, outside the partition: not.
 *
 * Needs root, loop devices and a kernel that reads MBR partition tables
 * (else it skips).
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/loop.h>

#include "overlay.h"
#include "overlay_file.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define DISK_SIZE (8u << 20)

int
main (void)
{
  const char *dir;
  char disk_image[4096], path[4096], path2[4096], disk[64], part[80],
    over[64], err[512];
  char *written = NULL;
  struct stat st;
  int disk_fd, over_fd, r;
  bool failed = false;

  unit_free_loop (disk, sizeof disk);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (disk_image, sizeof disk_image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/disk.overlay", dir);
  unit_make_tagged_image (disk_image, DISK_SIZE, "a disk");
  /* An MBR with one partition from sector 8 (4 KiB) on: the overlay's
   * cluster at UNIT_OVERLAY_CLUSTER_AT, 12 KiB, is inside it.
   */
  {
    unsigned char mbr[512];
    const uint32_t start = 8, sectors = DISK_SIZE / 512 - 8;
    int fd = open (disk_image, O_RDWR | O_CLOEXEC);

    CHECK (fd >= 0, "%s: %s", disk_image, strerror (errno));
    CHECK (pread (fd, mbr, sizeof mbr, 0) == sizeof mbr, "read MBR");
    memset (mbr + 446, 0, 64);
    mbr[446 + 4] = 0x83;
    memcpy (mbr + 446 + 8, &start, 4);
    memcpy (mbr + 446 + 12, &sectors, 4);
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    CHECK (pwrite (fd, mbr, sizeof mbr, 0) == sizeof mbr, "write MBR");
    close (fd);
  }
  disk_fd = unit_loop_attach_flags (disk, disk_image, LO_FLAGS_PARTSCAN);
  snprintf (part, sizeof part, "%sp1", disk);
  for (int i = 0; stat (part, &st) == -1; i++) {
    if (i == 100)
      unit_skip ("%s did not appear", part);
    unit_sleep_ms (20);
  }
  unit_make_overlay (disk, path);
  unit_free_loop (over, sizeof over);
  over_fd = unit_loop_attach (over, part, true);

  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  written = NULL;
  if (r == 0)
    printf ("NOT refused: the commit wrote %s under the loop device %s "
            "over its partition %s\n", disk, over, part);
  else
    printf ("refused: %s\n", err);
  failed |= r == 0 || unit_byte_at (disk_image, UNIT_OVERLAY_CLUSTER_AT) == 0x5a;
  close (over_fd);

  /* The other way round: the partition the base, a loop device over its
   * whole disk (losetup -o OFFSET /dev/sdb to mount the partition).
   */
  snprintf (path2, sizeof path2, "%s/part.overlay", dir);
  unit_make_overlay (part, path2);
  unit_free_loop (over, sizeof over);
  over_fd = unit_loop_attach (over, disk, true);
  r = mloop_overlay_file_commit (path2, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  written = NULL;
  if (r == 0)
    printf ("NOT refused: the commit wrote the partition %s under the loop "
            "device %s over its disk %s\n", part, over, disk);
  else
    printf ("refused: %s\n", err);
  failed |= r == 0;
  close (over_fd);

  /* But not a loop device over another region of the disk (here its
   * first 4 KiB, the MBR, before the partition): that one shares no
   * byte with the base, and the commit goes on.
   */
  unit_free_loop (over, sizeof over);
  over_fd = unit_loop_attach (over, disk, true);
  {
    struct loop_info64 info;

    memset (&info, 0, sizeof info);
    CHECK (ioctl (over_fd, LOOP_GET_STATUS64, &info) == 0, "%s: %s", over,
           strerror (errno));
    info.lo_sizelimit = 4096;
    CHECK (ioctl (over_fd, LOOP_SET_STATUS64, &info) == 0, "%s: %s", over,
           strerror (errno));
  }
  r = mloop_overlay_file_commit (path2, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  written = NULL;
  if (r == 0)
    printf ("committed under a loop device over the disk's first 4 KiB\n");
  else
    printf ("refused under a loop device over the disk's first 4 KiB, "
            "outside the partition: %s\n", err);
  failed |= r != 0;
  close (over_fd);
  close (disk_fd);
  CHECK (!failed, "a commit wrote under a loop device over the base's "
         "disk or partition, or was refused under one over another region");
  printf ("ok\n");
  return 0;
}
