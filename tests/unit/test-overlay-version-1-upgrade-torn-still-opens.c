/* A version 1 header made version 2 (adopt, or a server recording the
 * base of one whose path left no room for a flags word; engine/
 * overlay.c, upgrade_header) is never torn by a power cut into a
 * header that no open takes, or that says what it did not.
 *
 * A disk promises only that a sector (512 bytes) is written whole.
 * Version 2 keeps its flags word at byte 4072, in the header's last
 * sector, where a version 1 path of 4,008 bytes or more keeps path
 * bytes: written in one go, the first sector (the version) could land
 * without the last, and the flags word be the path's ASCII, whose
 * unknown bits every open refuses as a newer mloop's (adopt, commit,
 * every server: the overlay's data stranded).  The other way round, a
 * version 1 header keeps a path cut short or made of two paths, which a
 * commit would write into, checked by its size alone; or, its path
 * ending early, a flags word of the old path's bytes, read as a failed
 * sync's mark.
 *
 * This program's pwritev2 stands in for the C library's (the engine is
 * linked in statically) and keeps every write of the header with what
 * the file held before it.  Then every state a cut could leave (each
 * write, any of its changed sectors landed) is put into a copy of the
 * overlay and checked: inspect reads it, a version 1 one recording the
 * old path or none a commit would follow (not absolute), adopt opens
 * it, and the failed sync's mark is what it was.  No root: about 1 s,
 * in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "backing.h"
#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define HDR_BYTES 4096
#define HDR_FLAGS 4072
#define SECTOR 512
#define SECTORS (HDR_BYTES / SECTOR)
#define FLAG_SYNC_FAILED 8u
#define MAX_WRITES 16

static struct stat overlay_st;
static bool recording;
static unsigned writes;
static unsigned char before[MAX_WRITES][HDR_BYTES];
static unsigned char after[MAX_WRITES][HDR_BYTES];

static bool
is_overlay (int fd)
{
  struct stat st;

  return overlay_st.st_ino != 0 && fstat (fd, &st) == 0 &&
    st.st_dev == overlay_st.st_dev && st.st_ino == overlay_st.st_ino;
}

/* Every write of the engine goes through mloop_pwrite_all, which
 * calls pwritev2 (pwritev64v2 with 64-bit file offsets, the C library's
 * header renames it).
 */
ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  if (recording && offset == 0 && iovcnt == 1 &&
      iov[0].iov_len == HDR_BYTES && is_overlay (fd)) {
    CHECK (writes < MAX_WRITES, "more than %d header writes", MAX_WRITES);
    CHECK (syscall (SYS_pread64, fd, before[writes], HDR_BYTES, 0L) ==
           HDR_BYTES, "reading the header: %s", strerror (errno));
    memcpy (after[writes], iov[0].iov_base, HDR_BYTES);
    writes++;
  }
  return (ssize_t) syscall (SYS_pwritev2, fd, iov, iovcnt, (long) offset,
                            0L, flags);
}

static void
put_header (const char *path, const unsigned char *h)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, h, HDR_BYTES, 0) == HDR_BYTES &&
         close (fd) == 0, "%s: %s", path, strerror (errno));
}

/* Checks the overlay at PATH, torn as STATE says, over BASE_PATH. */
static void
check_torn (const char *base_path, const char *path, const char *old_name,
            bool sync_failed, const char *state)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  char *recorded = NULL, err[512];
  uint64_t size;
  bool known;
  int r;

  r = mloop_overlay_inspect (path, &recorded, &size, &known, err,
                             sizeof err);
  CHECK (r == 0, "%s: inspect refused it: %s", state, err);
  CHECK (known || recorded[0] != '/' || strcmp (recorded, old_name) == 0,
         "%s: a version 1 header recording %.40s... (%zu bytes), neither "
         "its old path (%zu bytes) nor one a commit refuses to follow",
         state, recorded, strlen (recorded), strlen (old_name));
  free (recorded);
  CHECK (mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                             err, sizeof err) == 0, "base: %s", err);
  r = mloop_overlay_open (&ov, path, &base, false, MLOOP_OVERLAY_ADOPT_BASE,
                          err, sizeof err);
  CHECK (r == 0, "%s: adopt refused it, which strands its data: %s", state,
         err);
  CHECK (mloop_overlay_sync_failed (&ov) == sync_failed,
         "%s: the failed sync's mark reads %s", state,
         sync_failed ? "cleared" : "set");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

/* A version 1 overlay at DIR/NAME recording OLD_NAME, with a failed
 * sync's mark when SYNC_FAILED (OLD_NAME must leave it room), adopted
 * over BASE_PATH: every state a power cut could leave opens.
 */
static unsigned
upgrade (const char *dir, const char *base_path, const char *name,
         const char *old_name, bool sync_failed)
{
  char path[PATH_MAX], pristine[PATH_MAX], torn[PATH_MAX], err[512];
  char *recorded = NULL, *abs = realpath (base_path, NULL), state[128];
  unsigned char h[HDR_BYTES];
  uint64_t size;
  bool known;
  unsigned states = 0;

  snprintf (path, sizeof path, "%s/%s", dir, name);
  snprintf (pristine, sizeof pristine, "%s/%s.v1", dir, name);
  snprintf (torn, sizeof torn, "%s/%s.torn", dir, name);
  unit_make_overlay (base_path, path);
  unit_make_version_1 (path, old_name);
  if (sync_failed) {
    const unsigned char mark = FLAG_SYNC_FAILED;
    int fd = open (path, O_WRONLY | O_CLOEXEC);

    CHECK (strlen (old_name) < HDR_FLAGS - 64, "no room for the mark");
    CHECK (fd >= 0 && pwrite (fd, &mark, 1, HDR_FLAGS) == 1 &&
           close (fd) == 0, "%s: %s", path, strerror (errno));
  }
  unit_copy_file (path, pristine);
  CHECK (stat (path, &overlay_st) == 0, "stat %s: %s", path,
         strerror (errno));
  writes = 0;
  recording = true;
  CHECK (unit_try_open_overlay (base_path, path, MLOOP_OVERLAY_ADOPT_BASE,
                                err, sizeof err) == 0, "adopt: %s", err);
  recording = false;
  CHECK (writes > 0, "adopting a version 1 overlay wrote no header");
  CHECK (mloop_overlay_inspect (path, &recorded, &size, &known, err,
                                sizeof err) == 0, "inspect: %s", err);
  CHECK (known && abs && strcmp (recorded, abs) == 0,
         "adopt left the header recording %s", recorded);
  free (recorded);
  free (abs);

  for (unsigned w = 0; w < writes; w++) {
    unsigned changed[SECTORS], n = 0;

    for (unsigned s = 0; s < SECTORS; s++)
      if (memcmp (before[w] + s * SECTOR, after[w] + s * SECTOR, SECTOR))
        changed[n++] = s;
    for (unsigned landed = 0; landed < 1u << n; landed++) {
      memcpy (h, before[w], HDR_BYTES);
      for (unsigned i = 0; i < n; i++)
        if (landed & 1u << i)
          memcpy (h + changed[i] * SECTOR, after[w] + changed[i] * SECTOR,
                  SECTOR);
      snprintf (state, sizeof state, "%s, header write %u of %u, changed "
                "sectors landed 0x%x of %u", name, w + 1, writes, landed, n);
      /* Opening it rewrites only the header. */
      if (states == 0)
        unit_copy_file (pristine, torn);
      put_header (torn, h);
      check_torn (base_path, torn, old_name, sync_failed, state);
      states++;
    }
  }
  CHECK (unlink (torn) == 0 && unlink (pristine) == 0 && unlink (path) == 0,
         "unlink: %s", strerror (errno));
  return states;
}

/* An absolute path of LEN bytes naming nothing, in BUF. */
static const char *
long_name (char *buf, size_t len)
{
  CHECK (len + 1 <= HDR_BYTES, "too long");
  memset (buf, 'o', len);
  buf[len] = '\0';
  for (size_t i = 0; i < len; i += 200)
    buf[i] = '/';
  return buf;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[PATH_MAX], name[HDR_BYTES];
  unsigned states = 0;

  unit_deadline (60);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  unit_make_image (base_path, BASE_SIZE);

  /* The path runs into the flags word: no mark, no room for one. */
  states += upgrade (dir, base_path, "long", long_name (name, 4010), false);
  /* The path runs into the last sector and ends before the flags word,
   * which holds a failed sync's mark.
   */
  states += upgrade (dir, base_path, "into-last-sector",
                     long_name (name, 3600), true);
  /* Within the first sector. */
  states += upgrade (dir, base_path, "short", "/gone/base.img", true);
  printf ("%u torn states open\n", states);
  return 0;
}
