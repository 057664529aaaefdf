/* A header rewrite never changes the merge's mark and the base's
 * identity in one write (engine/overlay.c, record_base).
 *
 * The header is one 4 KiB block, and a disk promises only that a
 * sector (512 bytes) is written whole: a power cut during a rewrite can
 * leave some sectors old and some new.  The mark lives in the flags
 * word of the last sector, the base's path, device and inode in the
 * first ones.  Recording another image with the mark set in one write
 * (a commit into an adopted image), or another image with the mark
 * cleared (a server adopting another image over a stopped commit),
 * could tear into the old file's identity under the new mark state: a
 * half-merged base left unmarked (discard then removes the overlay and
 * the clusters it still needs), or a mark on a file no merge wrote.
 * So a write that changes the mark changes nothing else, and the
 * identity changes in writes of their own; a torn identity alone is
 * refused as another image.
 *
 * This program's pwritev2 stands in for the C library's (the engine is
 * linked in statically): before each write of the overlay's header it
 * reads what the file holds and compares.  No root: about 0.05 s, in
 * the unit suite of every tier.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define HDR_BYTES 4096
#define HDR_FLAGS 4072
#define FLAG_MERGING 1u

static struct stat overlay_st;
static unsigned marks_set, marks_cleared, torn_writes;

static bool
is_overlay (int fd)
{
  struct stat st;

  return overlay_st.st_ino != 0 && fstat (fd, &st) == 0 &&
    st.st_dev == overlay_st.st_dev && st.st_ino == overlay_st.st_ino;
}

static uint32_t
flags_of (const unsigned char *h)
{
  return (uint32_t) h[HDR_FLAGS] | (uint32_t) h[HDR_FLAGS + 1] << 8 |
    (uint32_t) h[HDR_FLAGS + 2] << 16 | (uint32_t) h[HDR_FLAGS + 3] << 24;
}

/* Compares a header write (NEW) with the header the file holds. */
static void
check_header_write (int fd, const unsigned char *new)
{
  static unsigned char old[HDR_BYTES];
  bool was_marked, marks;

  if (syscall (SYS_pread64, fd, old, HDR_BYTES, 0L) != HDR_BYTES)
    return;                     /* a new file: nothing to tear */
  was_marked = flags_of (old) & FLAG_MERGING;
  marks = flags_of (new) & FLAG_MERGING;
  if (was_marked == marks)
    return;
  if (marks)
    marks_set++;
  else
    marks_cleared++;
  if (memcmp (old, new, HDR_FLAGS) != 0 ||
      memcmp (old + HDR_FLAGS + 4, new + HDR_FLAGS + 4,
              HDR_BYTES - HDR_FLAGS - 4) != 0)
    torn_writes++;
}

/* Every write of the engine goes through mloop_pwrite_all, which
 * calls pwritev2 (pwritev64v2 with 64-bit file offsets, the C library's
 * header renames it).
 */
ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  if (offset == 0 && iovcnt == 1 && iov[0].iov_len == HDR_BYTES &&
      is_overlay (fd))
    check_header_write (fd, iov[0].iov_base);
  return (ssize_t) syscall (SYS_pwritev2, fd, iov, iovcnt, (long) offset,
                            0L, flags);
}

static void
make_overlay (const char *base_path, const char *path)
{
  unit_make_overlay (base_path, path);
  CHECK (stat (path, &overlay_st) == 0, "stat %s: %s", path,
         strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], other_path[4096], path[4096], err[512];
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (other_path, sizeof other_path, "%s/other.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_tagged_image (other_path, BASE_SIZE, "another image");

  /* A commit into an adopted image records it, with the mark. */
  make_overlay (base_path, path);
  r = mloop_overlay_merge (path, other_path, true, false, err, sizeof err);
  CHECK (r == 0, "commit into the adopted image: %s", err);
  CHECK (marks_set > 0, "the commit never set the mark");
  CHECK (torn_writes == 0,
         "recording the adopted image set the mark in the write that "
         "changed the recorded identity: torn at a power cut, the old "
         "base's path could stand under the new mark");
  CHECK (unlink (path) == 0, "unlink: %s", strerror (errno));

  /* A commit stopped half-way in the base, then a server adopting
   * another image: the mark goes, the other image is recorded.
   */
  make_overlay (base_path, path);
  unit_stop_commit (path, base_path, MLOOP_OVERLAY_MERGE_BASE);
  marks_cleared = 0;
  r = unit_try_open_overlay (other_path, path, MLOOP_OVERLAY_ADOPT_BASE, err,
                             sizeof err);
  CHECK (r == 0, "adopting another image: %s", err);
  CHECK (marks_cleared > 0, "adopting another image kept the mark");
  CHECK (torn_writes == 0,
         "adopting another image cleared the mark in the write that "
         "changed the recorded identity: torn at a power cut, the "
         "half-merged base could stand recorded without its mark");
  return 0;
}
