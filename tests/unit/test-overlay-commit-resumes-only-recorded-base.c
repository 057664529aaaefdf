/* A commit stopped half-way runs again over its base's changed ends
 * only in the recorded file itself (engine/overlay.c, check_base): the
 * merge's mark lets it write that file whatever its first and last MiB
 * hold.  Another filesystem mounted at the base's place, keeping no
 * birth times, may hold another image there under the recorded inode
 * number: with the inode and path alike but the device not, and no
 * birth to tell them apart, the commit must refuse it, not write the
 * overlay's clusters into it.  The same file found under another device
 * number with a birth both know (its filesystem mounted again) still
 * resumes.
 *
 * The other filesystem is played by another image at the path and a
 * header naming its inode, another device and no birth.  No root:
 * about 0.05 s, in the unit suite of every tier.
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
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

static void
put_u64 (const char *path, off_t at, uint64_t v)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, &v, sizeof v, at) == (ssize_t) sizeof v &&
         close (fd) == 0, "%s: %s", path, strerror (errno));
}

static uint64_t
get_u64 (const char *path, off_t at)
{
  uint64_t v;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &v, sizeof v, at) == (ssize_t) sizeof v &&
         close (fd) == 0, "%s: %s", path, strerror (errno));
  return v;
}

/* Fills the first MiB of the image at PATH with BYTE: ends the overlay's
 * fingerprint does not know.
 */
static void
fill_first_mib (const char *path, int byte)
{
  static char buf[1u << 20];
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, byte, sizeof buf);
  CHECK (fd >= 0 && pwrite (fd, buf, sizeof buf, 0) == (ssize_t) sizeof buf
         && close (fd) == 0, "%s: %s", path, strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], ov_path[4096], err[1024];
  struct statx stx;
  struct stat st;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  /* A commit into the base stopped half-way; then another filesystem
   * at the base's place, keeping no births, with another image of the
   * recorded inode number there.
   */
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, ov_path);
  unit_mark_merging (base_path, ov_path);
  CHECK (unlink (base_path) == 0, "unlink: %s", strerror (errno));
  unit_make_image (base_path, BASE_SIZE);
  fill_first_mib (base_path, 0x11);
  CHECK (stat (base_path, &st) == 0, "%s: %s", base_path, strerror (errno));
  put_u64 (ov_path, UNIT_HDR_BASE_INO, (uint64_t) st.st_ino);
  put_u64 (ov_path, UNIT_HDR_BASE_DEV, (uint64_t) st.st_dev + 1);
  put_u64 (ov_path, UNIT_HDR_BASE_BIRTH, 0);
  r = mloop_overlay_merge (ov_path, base_path, false, false, err,
                           sizeof err);
  CHECK (r < 0, "a stopped commit was resumed into another filesystem's "
         "image of the recorded inode number at the base's path");
  CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
         "why: %s", err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x11,
         "the other image was written");

  /* The recorded file itself, its filesystem mounted again under
   * another device number: a birth both know says it is, and the commit
   * resumes.
   */
  if (statx (AT_FDCWD, base_path, 0, STATX_BTIME, &stx) != 0 ||
      !(stx.stx_mask & STATX_BTIME) || stx.stx_btime.tv_sec == 0) {
    printf ("ok: a stopped commit resumes only in its recorded base "
            "(no birth times here: the remount not tried)\n");
    return 0;
  }
  CHECK (unlink (ov_path) == 0, "unlink: %s", strerror (errno));
  unit_make_overlay (base_path, ov_path);
  unit_mark_merging (base_path, ov_path);
  fill_first_mib (base_path, 0x22);
  put_u64 (ov_path, UNIT_HDR_BASE_DEV, get_u64 (ov_path, UNIT_HDR_BASE_DEV) + 1);
  r = mloop_overlay_merge (ov_path, base_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "the stopped commit did not resume in its own base, its "
         "filesystem under another device number: %s", err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the resumed commit did not write the overlay's cluster");

  printf ("ok: a stopped commit resumes only in its recorded base\n");
  return 0;
}
