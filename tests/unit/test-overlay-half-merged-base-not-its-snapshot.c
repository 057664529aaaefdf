/* A commit stopped half-way has its mark on the recorded base, still
 * at its recorded path.  A snapshot of the base's filesystem taken
 * before (LVM, a copy of a filesystem image, btrfs) holds a file of the
 * same inode number and birth time, with the ends the overlay recorded,
 * on another device at another path.  Taken for the recorded file (the
 * same inode and birth, wherever found), it was exempt from the refusal
 * of any other image while the half-merged file is at its path: a
 * commit with --base naming it, or a server over it, recorded it with
 * the mark, and the half-merged original kept nothing saying so.  Only
 * the very file at the recorded path (or a hard link of it: the same
 * device and inode) is the half-merged one; the snapshot must be
 * refused as a copy is.
 *
 * The snapshot is a copy of a small ext4 image mounted beside it, in a
 * mount namespace of the test's own (its mounts go with it).  Needs
 * root, loop devices and mkfs.ext4: else it skips.  About 0.3 s, in
 * the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

/* The mount points, unmounted at exit before the test's directory is
 * removed (handlers run last registered first): still mounted in the
 * test's namespace, they could not be removed, and the directory stayed.
 */
static char m1[2048], m2[2048];

static void
unmount_all (void)
{
  umount2 (m2, MNT_DETACH);
  umount2 (m1, MNT_DETACH);
}

/* Runs the shell command CMD: whether it succeeded. */
static int
run (const char *cmd)
{
  return system (cmd) == 0;
}

int
main (void)
{
  const char *dir;
  char fs[2048], snap[2048], cmd[16384];
  char base_path[4096], snap_base[4096], ov_path[4096], err[1024];
  struct stat a, b;
  int r;

  if (geteuid () != 0)
    unit_skip ("mounts need root");
  if (access ("/sbin/mkfs.ext4", X_OK) == -1 &&
      access ("/usr/sbin/mkfs.ext4", X_OK) == -1)
    unit_skip ("no mkfs.ext4");
  if (unshare (CLONE_NEWNS) == -1 ||
      mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == -1)
    unit_skip ("no mount namespace: %s", strerror (errno));
  unit_deadline (60);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (fs, sizeof fs, "%s/fs.img", dir);
  snprintf (snap, sizeof snap, "%s/snap.img", dir);
  snprintf (m1, sizeof m1, "%s/m1", dir);
  snprintf (m2, sizeof m2, "%s/m2", dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", m1);
  snprintf (snap_base, sizeof snap_base, "%s/base.img", m2);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);
  CHECK (mkdir (m1, 0700) == 0 && mkdir (m2, 0700) == 0, "mkdir: %s",
         strerror (errno));
  atexit (unmount_all);

  snprintf (cmd, sizeof cmd, "truncate -s 32M '%s' && mkfs.ext4 -q -F '%s' "
            "&& mount -o loop '%s' '%s'", fs, fs, fs, m1);
  if (!run (cmd))
    unit_skip ("cannot make and mount an ext4 image");
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, ov_path);
  /* The snapshot, taken before the commit. */
  snprintf (cmd, sizeof cmd, "umount '%s' && cp '%s' '%s' && "
            "mount -o loop '%s' '%s' && mount -o loop '%s' '%s'", m1, fs,
            snap, fs, m1, snap, m2);
  CHECK (run (cmd), "cannot mount the snapshot");
  CHECK (stat (base_path, &a) == 0 && stat (snap_base, &b) == 0,
         "stat: %s", strerror (errno));
  CHECK (a.st_ino == b.st_ino && a.st_dev != b.st_dev, "the snapshot's "
         "file is not the base's inode on another device");

  unit_stop_commit (ov_path, base_path, MLOOP_OVERLAY_MERGE_BASE);

  r = mloop_overlay_merge (ov_path, snap_base, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a commit into a snapshot of the base was taken while the "
         "base it stopped half-way in is still at its path");
  CHECK (strstr (err, base_path) != NULL && strstr (err, "half-way"),
         "the refusal does not name the half-merged base: %s", err);
  CHECK (unit_still_marks (ov_path, base_path), "the mark left the half-merged "
         "base");
  CHECK (unit_byte_at (snap_base, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the snapshot was written");

  r = unit_try_open_overlay (snap_base, ov_path, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err);
  CHECK (r < 0, "a server took a snapshot of the base a commit stopped "
         "half-way in");
  CHECK (unit_still_marks (ov_path, base_path), "the server moved the mark");

  /* The half-merged file itself, resumed: still written. */
  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r == 0, "the commit no longer resumes in the half-merged base: %s",
         err);

  printf ("ok: a snapshot of a half-merged base is refused\n");
  return 0;
}
