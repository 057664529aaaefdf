/* A base replaced at its path by a copy of itself (a restore: `rm
 * base.img; cp backup.img base.img`) is another file, but ext4 gives it
 * the freed inode number again: device, inode and path all alike, only
 * its birth time tells it from the file the header records.  The
 * identity check goes by that birth (engine/overlay.c, recorded_file)
 * and takes the copy by its content; the merge must then record the
 * copy, birth and all, with its mark before writing into it.  Marked
 * without it, a commit stopped half-way in the copy could not run
 * again: its ends changed, and the header still named the old file's
 * birth, so the copy passed for neither the recorded file nor the base.
 *
 * Where the filesystem does not give the inode number again, the header
 * is made to name the copy's number; where the copy is born in the
 * recorded second, the header is made to name the second before: the
 * same case either way.  No root: about 0.05 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static uint64_t
inode_of (const char *path)
{
  struct stat st;

  CHECK (stat (path, &st) == 0, "%s: %s", path, strerror (errno));
  return (uint64_t) st.st_ino;
}

static uint64_t
birth_of (const char *path)
{
  struct statx stx;

  CHECK (statx (AT_FDCWD, path, 0, STATX_BTIME, &stx) == 0, "%s: %s", path,
         strerror (errno));
  return (stx.stx_mask & STATX_BTIME) ? (uint64_t) stx.stx_btime.tv_sec : 0;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], copy[4096], path[4096], err[512];
  char *written = NULL;
  unsigned char byte = 0;
  uint64_t birth;
  int fd;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (copy, sizeof copy, "%s/backup.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);

  unit_make_tagged_image (base_path, BASE_SIZE, "template");
  unit_make_overlay (base_path, path);
  birth = unit_get_u64 (path, UNIT_HDR_BASE_BIRTH);
  if (birth == 0)
    unit_skip ("%s keeps no birth times", dir);
  unit_make_tagged_image (copy, BASE_SIZE, "template");
  CHECK (unlink (base_path) == 0, "unlink: %s", strerror (errno));
  fd = open (base_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  CHECK (fd >= 0 && ftruncate (fd, BASE_SIZE) == 0 &&
         pwrite (fd, "template", 8, 0) == 8 && close (fd) == 0,
         "%s: %s", base_path, strerror (errno));
  if (inode_of (base_path) != unit_get_u64 (path, UNIT_HDR_BASE_INO))
    unit_put_u64 (path, UNIT_HDR_BASE_INO, inode_of (base_path));
  if (birth_of (base_path) == birth)
    unit_put_u64 (path, UNIT_HDR_BASE_BIRTH, birth - 1);

  unit_stop_commit (path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0,
         "the commit stopped in a copy of the base holding its inode "
         "number cannot run again: %s", err);
  free (written);
  fd = open (base_path, O_RDONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pread (fd, &byte, 1, UNIT_OVERLAY_CLUSTER_AT) == 1,
         "%s: %s", base_path, strerror (errno));
  close (fd);
  CHECK (byte == 0x5a, "the base holds 0x%02x, not the overlay's 0x5a",
         byte);
  printf ("ok: a commit stopped in a copy of its base under the freed "
          "inode number runs again\n");
  return 0;
}
