/* A commit stopped half-way marks the overlay, and discard then refuses
 * it.  On a filesystem keeping no birth time (NFS on Debian 12's
 * kernel) after a remount under another device number, the recorded
 * file is known as such only at its recorded path.  Given to a server
 * under another name (a hard link, the export mounted at a second
 * place), it is the very file at that path, which the refusal of other
 * images lets through, yet it was then taken for a copy of the base:
 * where the merge wrote only past the first and last MiB it kept the
 * recorded ends, so it was served, recorded without the mark, and
 * discard removed the overlay the half-merged file still needs.
 *
 * That file under any name is the recorded one: a server must refuse
 * it as written since, and adopting it must keep the mark, so that a
 * plain commit then finishes the merge in it.
 *
 * The remount is played by writing another device number into the
 * header, and a filesystem keeping no birth time by clearing the one
 * recorded.  No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
/* Clusters between the first and the last MiB: the fingerprint's ends
 * do not see them.  The merge stops after the first.
 */
#define MERGED_AT (2u << 20)
#define UNMERGED_AT (MERGED_AT + MLOOP_OVERLAY_CLUSTER)

/* Whether the overlay at PATH carries the merge's mark, whatever base
 * it names.
 */
static bool
marked (const char *path)
{
  char *recorded = NULL, err[512];
  uint64_t size;
  bool known, merging = false;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0, "%s: %s", path, strerror (errno));
  CHECK (mloop_overlay_inspect_fd (fd, path, &recorded, &size, &known,
                                   &merging, err, sizeof err) == 0,
         "inspect: %s", err);
  close (fd);
  free (recorded);
  return merging;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], link_path[4096], ov_path[4096], err[1024];
  char cluster[MLOOP_OVERLAY_CLUSTER];
  int fd, r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (link_path, sizeof link_path, "%s/link.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);

  unit_make_image (base_path, BASE_SIZE);
  unit_write_cluster (base_path, ov_path, MERGED_AT);
  unit_write_cluster (base_path, ov_path, UNMERGED_AT);
  /* The merge stopped after its first cluster. */
  unit_mark_merging (base_path, ov_path);
  memset (cluster, 0x5a, sizeof cluster);
  fd = open (base_path, O_WRONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pwrite (fd, cluster, sizeof cluster, MERGED_AT) ==
         (ssize_t) sizeof cluster && fsync (fd) == 0 && close (fd) == 0,
         "%s: %s", base_path, strerror (errno));
  unit_renumber_base_device (ov_path);
  unit_put_u64 (ov_path, UNIT_HDR_BASE_BIRTH, 0);
  CHECK (link (base_path, link_path) == 0, "link: %s", strerror (errno));

  r = unit_try_open_overlay (link_path, ov_path, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err);
  CHECK (marked (ov_path), "a server given the half-merged base by another "
         "name dropped the merge's mark (%s)", r == 0 ? "served" : err);
  CHECK (r < 0 && strstr (err, "written since"), "a server served the "
         "half-merged base by another name as a copy: %s",
         r == 0 ? "served" : err);
  CHECK (mloop_overlay_file_discard (ov_path, err, sizeof err) == -1,
         "the overlay the half-merged base needs was discarded");

  /* Adopted under that name it is still the file the merge wrote. */
  r = mloop_overlay_adopt (ov_path, link_path, err, sizeof err);
  CHECK (r == 0, "adopting the half-merged base by another name: %s", err);
  CHECK (unit_still_marks (ov_path, link_path), "adopting the half-merged "
         "base by another name dropped the merge's mark");
  CHECK (mloop_overlay_file_discard (ov_path, err, sizeof err) == -1,
         "the overlay the adopted, half-merged base needs was discarded");

  r = mloop_overlay_merge (ov_path, link_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "the commit did not resume in the adopted base: %s", err);
  CHECK (unit_byte_at (base_path, MERGED_AT) == 0x5a &&
         unit_byte_at (base_path, UNMERGED_AT) == 0x5a,
         "the base does not hold the overlay");

  printf ("ok: a half-merged base under another name keeps the mark\n");
  return 0;
}
