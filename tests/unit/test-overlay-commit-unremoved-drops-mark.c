/* A commit that merged every cluster but could not remove the overlay
 * (its directory append-only or not writable by the caller, the name
 * replaced, a power cut before the directory was synced) must not leave
 * the overlay with the merge's mark.  Marked, discard would call it a
 * commit stopped half-way and advise running the commit again; by then
 * the base may have been written on its own (it is done with the
 * overlay), and the commit, resuming under the mark, would write the
 * overlay's old clusters over those writes.  Marked as merged instead,
 * a commit refuses it, discard removes it.
 *
 * Needs root and chattr on an ext4 /var/tmp (else it skips).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commit_fixture.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

int
main (void)
{
  const char *dir;
  char image[4096], sub[4096], path[8192], err[512], first[512];
  char *written = NULL;
  unsigned char newer[MLOOP_OVERLAY_CLUSTER];
  int fd, r;

  if (geteuid () != 0)
    unit_skip ("chattr needs root");
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (image, sizeof image, "%s/base.img", dir);
  snprintf (sub, sizeof sub, "%s/overlays", dir);
  snprintf (path, sizeof path, "%s/overlay", sub);
  CHECK (mkdir (sub, 0755) == 0, "%s: %s", sub, strerror (errno));
  unit_make_tagged_image (image, BASE_SIZE, "a base");
  unit_make_overlay (image, path);

  unit_commit_unremoved (path, sub, err, sizeof err);
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the merge did not run");
  snprintf (first, sizeof first, "%s", err);

  /* The base, done with the overlay, written on its own. */
  memset (newer, 0x77, sizeof newer);
  fd = open (image, O_RDWR | O_CLOEXEC);
  CHECK (fd >= 0 && pwrite (fd, newer, sizeof newer,
                            UNIT_OVERLAY_CLUSTER_AT) == sizeof newer &&
         fsync (fd) == 0, "%s: %s", image, strerror (errno));
  close (fd);

  /* Committed again: refused, the overlay spent. */
  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  written = NULL;
  printf ("commit again: %d: %s\n", r, r ? err : "ok");
  printf ("the base's cluster now: 0x%02x (0x77 written since)\n",
          unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT));
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0x77,
         "the base's own write was overwritten by the overlay's old cluster");
  CHECK (r == -1 && strstr (err, "committed into its base") != NULL,
         "a second commit was not refused as committed already");
  CHECK (!unit_still_marks (path, image), "the merged overlay kept the "
         "merge's mark");
  CHECK (strstr (first, "discard") != NULL,
         "the commit's message does not say the overlay can be discarded");

  r = mloop_overlay_file_discard (path, err, sizeof err);
  printf ("discard: %d: %s\n", r, r ? err : "ok");
  CHECK (r == 0 && access (path, F_OK) == -1 && errno == ENOENT,
         "discard did not remove the merged overlay");
  printf ("ok\n");
  return 0;
}
