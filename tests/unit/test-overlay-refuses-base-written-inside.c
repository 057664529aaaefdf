/* An overlay is refused over its base written since, wherever it was
 * written (engine/overlay.c, check_base).  The fingerprint covers the
 * base's first and last MiB only: a partitioned image keeps its
 * filesystems past the first MiB, where a write changes nothing it
 * sees.  The commonest such write is mloop's own: two overlays over
 * one base, one of them committed.  The other, attached again, would
 * then show its base's new bytes wherever it never wrote, under a
 * filesystem whose metadata it holds from before: garbage, silently.
 * The file itself (same path, device, inode and birth) with another
 * modification time was written since.
 *
 * Here overlay A writes a cluster in the middle of a 4 MiB base and is
 * committed; overlay B, made before, must then be refused, served and
 * committed alike, until adopted; a copy of the base (another file,
 * the same bytes) is then served, and so is an overlay of a window of
 * the file after a write into another window, which no device over
 * this one sees; but not one whose window is the whole file, which is
 * the file itself, nor one made over the whole file and given the same
 * window of it grown since.  The base's times are set back
 * first, so the commit's write shows whatever the clock's grain.  No
 * root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
#define INSIDE (2u << 20)

/* Writes a cluster of 0x33 at AT of the file at PATH, as a device
 * serving another window of it would.
 */
static void
write_file (const char *path, off_t at)
{
  char buf[MLOOP_OVERLAY_CLUSTER];
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, 0x33, sizeof buf);
  CHECK (fd >= 0 && pwrite (fd, buf, sizeof buf, at) == (ssize_t) sizeof buf
         && close (fd) == 0, "writing %s: %s", path, strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], a_path[4096], b_path[4096], copy_path[4096];
  char err[1024];
  const struct timespec long_ago[2] = { { 1000000000, 0 },
                                        { 1000000000, 0 } };
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (a_path, sizeof a_path, "%s/a.overlay", dir);
  snprintf (b_path, sizeof b_path, "%s/b.overlay", dir);
  snprintf (copy_path, sizeof copy_path, "%s/copy.img", dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0, "utimensat: %s",
         strerror (errno));
  unit_make_empty_overlay (base_path, b_path);
  unit_write_cluster (base_path, a_path, INSIDE);
  r = mloop_overlay_merge (a_path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit of A: %s", err);

  r = unit_try_open_overlay (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r < 0, "overlay B was served over its base written since");
  CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
         "why: %s", err);
  CHECK (strstr (err, "mloop overlay adopt") != NULL, "the refusal of a "
         "server does not name the command that overrides it: %s", err);
  r = mloop_overlay_merge (b_path, base_path, false, false, err, sizeof err);
  CHECK (r < 0, "overlay B was committed over its base written since");
  CHECK (strstr (err, "--adopt-base") != NULL, "the refusal of a commit "
         "does not name the option that overrides it: %s", err);

  /* The user's word says it is the base. */
  r = unit_try_open_overlay (base_path, b_path, MLOOP_OVERLAY_ADOPT_BASE, err, sizeof err);
  CHECK (r == 0, "adopting the base: %s", err);
  r = unit_try_open_overlay (base_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r == 0, "overlay B once its base was adopted: %s", err);
  /* A copy is another file, with its own times: its bytes say what it
   * is, as before.
   */
  unit_copy_file (base_path, copy_path);
  r = unit_try_open_overlay (copy_path, b_path, MLOOP_OVERLAY_SAME_BASE, err, sizeof err);
  CHECK (r == 0, "overlay B over a copy of its base: %s", err);

  /* An overlay of a window of the file: a device may write another
   * window of it meanwhile, which is no write into this one's.
   */
  {
    const struct mloop_window first = { 0, INSIDE };
    char w_path[4096];

    snprintf (w_path, sizeof w_path, "%s/window.overlay", dir);
    CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0,
           "utimensat: %s", strerror (errno));
    r = unit_try_open_window (base_path, &first, w_path, MLOOP_OVERLAY_SAME_BASE,
                         err, sizeof err);
    CHECK (r == 0, "overlay of a window: %s", err);
    write_file (base_path, INSIDE + MLOOP_OVERLAY_CLUSTER);
    r = unit_try_open_window (base_path, &first, w_path, MLOOP_OVERLAY_SAME_BASE,
                         err, sizeof err);
    CHECK (r == 0, "an overlay of a window was refused for a write into "
           "another window: %s", err);
  }

  /* A window that is the whole file (a --sizelimit as large as the
   * image or larger) leaves no other window to write: it is the file,
   * and so is the base it names, written since.
   */
  {
    const struct mloop_window all = { 0, BASE_SIZE };
    const struct mloop_window beyond = { 0, 2 * BASE_SIZE };
    char o_path[4096];

    snprintf (o_path, sizeof o_path, "%s/whole.overlay", dir);
    CHECK (utimensat (AT_FDCWD, base_path, long_ago, 0) == 0,
           "utimensat: %s", strerror (errno));
    unit_make_empty_overlay (base_path, o_path);
    write_file (base_path, INSIDE);
    r = unit_try_open_window (base_path, &all, o_path, MLOOP_OVERLAY_SAME_BASE,
                         err, sizeof err);
    CHECK (r < 0, "an overlay was served over its base written since, "
           "given as a window of all of it");
    r = unit_try_open_window (base_path, &beyond, o_path, MLOOP_OVERLAY_SAME_BASE,
                         err, sizeof err);
    CHECK (r < 0, "an overlay was served over its base written since, "
           "given as a window past its end");

    /* The file grown since (truncate, qemu-img resize): the overlay's
     * size is now a window of it, less than all of it.  The overlay
     * recorded the whole file's times, so the file it is was written
     * since, window or not.
     */
    CHECK (truncate (base_path, BASE_SIZE + MLOOP_OVERLAY_CLUSTER) == 0,
           "growing %s: %s", base_path, strerror (errno));
    r = unit_try_open_window (base_path, &all, o_path, MLOOP_OVERLAY_SAME_BASE,
                              err, sizeof err);
    CHECK (r < 0, "an overlay made over all of its base was served over "
           "it written since, given as a window of the grown file");
    CHECK (strstr (err, "written since") != NULL, "the refusal does not say "
           "why: %s", err);
    /* Its override: adopt opens the whole file, of another size now, so
     * the file must be shrunk back first, as the refusal says.
     */
    CHECK (strstr (err, "shrink it back") != NULL, "the refusal of a grown "
           "file names an override that cannot work: %s", err);
    CHECK (truncate (base_path, BASE_SIZE) == 0, "shrinking %s: %s",
           base_path, strerror (errno));
    r = mloop_overlay_adopt (o_path, base_path, err, sizeof err);
    CHECK (r == 0, "adopting the base shrunk back, as the refusal says: %s",
           err);
  }
  return 0;
}
