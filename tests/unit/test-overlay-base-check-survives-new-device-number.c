/* An overlay's base is still its recorded file when the filesystem
 * holding it comes back under another device number (engine/overlay.c,
 * recorded_file).  Device numbers are not the file's: NFS and btrfs
 * number their mounts as they are made, device-mapper and USB disks
 * theirs as they appear, so after a reboot or a remount the same file
 * may show another st_dev.  Were the device number part of "the same
 * file", such a base written since (another overlay committed into
 * it) would be taken for a copy of itself, go by its first and last MiB
 * alone, be served, and have its new times recorded: the overlay would
 * show the base's new bytes under its own filesystem metadata from
 * before.  And a commit stopped half-way in it would lose its mark once
 * the base was adopted or served, letting discard leave the base
 * half-merged.
 *
 * The remount is played by writing another device number into the
 * header, as the next boot would find it.  No root: about 0.05 s, in
 * the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "align.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "range_lock.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
#define INSIDE (2u << 20)
/* Where the header keeps the base's st_dev (design.md, "The format"). */
#define HDR_BASE_DEV 48

/* Writes one cluster of 0x5a at INSIDE into the overlay at PATH. */
static void
write_inside (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct mloop_range_lock lock;
  char *buf = mloop_alloc_aligned (MLOOP_OVERLAY_CLUSTER,
                                   MLOOP_OVERLAY_CLUSTER);
  int r;

  CHECK (buf != NULL, "no memory");
  unit_open_overlay (&base, &ov, base_path, path);
  mloop_range_lock_init (&lock);
  memset (buf, 0x5a, MLOOP_OVERLAY_CLUSTER);
  r = mloop_overlay_rw (&ov, &base, &lock, true, buf, MLOOP_OVERLAY_CLUSTER,
                        INSIDE, false);
  CHECK (r == 0, "write: %s", strerror (-r));
  mloop_range_lock_destroy (&lock);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  mloop_free_aligned (buf, MLOOP_OVERLAY_CLUSTER);
}

/* The base's device number as the header of the overlay at PATH
 * records it (little-endian, as this machine's tests run).
 */
static uint64_t
recorded_dev (const char *path)
{
  uint64_t dev;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &dev, sizeof dev, HDR_BASE_DEV) ==
         (ssize_t) sizeof dev && close (fd) == 0, "%s: %s", path,
         strerror (errno));
  return dev;
}

/* The header of the overlay at PATH as the next boot finds it: its
 * base's filesystem mounted under another device number.
 */
static void
renumber_base_device (const char *path)
{
  const uint64_t dev = recorded_dev (path) + 1;
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, &dev, sizeof dev, HDR_BASE_DEV) ==
         (ssize_t) sizeof dev && close (fd) == 0, "%s: %s", path,
         strerror (errno));
}

static int
try_open (const char *base_path, const char *path,
          enum mloop_overlay_base_check check, char *err, size_t errlen)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  int r;

  r = mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                          err, errlen);
  CHECK (r == 0, "base: %s", err);
  r = mloop_overlay_open (&ov, path, &base, false, check, err, errlen);
  if (r == 0)
    mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  return r;
}

/* Marks the overlay at PATH as a commit into BASE_PATH stopped
 * half-way would have left it.
 */
static void
mark_merging (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  char err[512];

  unit_open_overlay (&base, &ov, base_path, path);
  CHECK (mloop_overlay_note_merging (&ov, &base, err, sizeof err) == 0,
         "mark: %s", err);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], a_path[4096], b_path[4096], c_path[4096];
  char err[1024];
  const struct timespec long_ago[2] = { { 1000000000, 0 },
                                        { 1000000000, 0 } };
  struct stat st;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (a_path, sizeof a_path, "%s/a.overlay", dir);
  snprintf (b_path, sizeof b_path, "%s/b.overlay", dir);
  snprintf (c_path, sizeof c_path, "%s/c.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (stat (base_path, &st) == 0, "%s: %s", base_path, strerror (errno));

  /* Not written since: served, and the new number recorded. */
  unit_make_empty_overlay (base_path, b_path);
  renumber_base_device (b_path);
  r = try_open (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r == 0, "overlay B over its unchanged base: %s", err);
  CHECK (recorded_dev (b_path) == (uint64_t) st.st_dev,
         "the base's new device number was not recorded");

  /* Written since in its middle, by another overlay's commit: the
   * times set back first, so the commit's write shows whatever the
   * clock's grain.
   */
  CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0, "utimensat: %s",
         strerror (errno));
  unlink (b_path);
  unit_make_empty_overlay (base_path, b_path);
  write_inside (base_path, a_path);
  r = mloop_overlay_merge (a_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit of A: %s", err);
  renumber_base_device (b_path);
  r = try_open (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r < 0, "overlay B was served over its base written since, its "
         "filesystem under another device number");
  CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
         "why: %s", err);
  r = mloop_overlay_merge (b_path, base_path, false, false, err, sizeof err);
  CHECK (r < 0, "overlay B was committed over its base written since, its "
         "filesystem under another device number");

  /* A commit stopped half-way, then a reboot: adopting the base keeps
   * the mark, which discard heeds.
   */
  unit_make_empty_overlay (base_path, c_path);
  mark_merging (base_path, c_path);
  renumber_base_device (c_path);
  CHECK (mloop_overlay_adopt (c_path, base_path, err, sizeof err) == 0,
         "adopt: %s", err);
  CHECK (mloop_overlay_file_discard (c_path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded once its "
         "base, under another device number, was adopted");
  CHECK (access (c_path, F_OK) == 0, "the half-committed overlay was "
         "removed");

  printf ("ok: the base is its recorded file under another device number\n");
  return 0;
}
