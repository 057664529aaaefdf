/* `mloop overlay discard` refuses an overlay whose commit stopped
 * half-way (device/overlay_file.c): the base holds part of the overlay
 * already, so with the overlay gone it would read as neither the old
 * image nor the overlay's device, with nothing left to say so.  Only
 * finishing the commit puts it right.
 *
 * The half-way commit is the mark a merge writes into the header before
 * its first write into the base (mloop_overlay_note_merging).  Adopting
 * that base, as a server refusing its changed ends advises, must keep
 * the mark, and so must recording it under a new name when it moved:
 * the base is still half-written.  No root: about 0.03 s, in
 * the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Writes the base's first cluster, as a merge of a cluster there does. */
static void
write_base_start (const char *base_path)
{
  int fd = open (base_path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, "merged", 6, 0) == 6 && close (fd) == 0,
         "%s: %s", base_path, strerror (errno));
}

static void
adopt (const char *base_path, const char *path)
{
  char err[512];

  CHECK (mloop_overlay_adopt (path, base_path, err, sizeof err) == 0,
         "adopt: %s", err);
}

static void
make_overlay (const char *base_path, const char *path, bool mark)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  char err[512];

  unit_open_overlay (&base, &ov, base_path, path);
  if (mark)
    CHECK (mloop_overlay_note_merging (&ov, &base, err, sizeof err) == 0,
           "mark: %s", err);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], plain[4096], moved[4096];
  char err[512];

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (plain, sizeof plain, "%s/plain", dir);
  unit_make_image (base_path, BASE_SIZE);

  make_overlay (base_path, path, true);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded");
  CHECK (strstr (err, "overlay commit") != NULL, "discard: %s", err);
  CHECK (access (path, F_OK) == 0, "the half-committed overlay was removed");

  /* Its base's first MiB changed: adopted, the base is still the one
   * the commit stopped in.
   */
  write_base_start (base_path);
  adopt (base_path, path);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded once "
         "its base was adopted");
  CHECK (access (path, F_OK) == 0, "the half-committed overlay was removed");

  /* The base moved: served under its new name, it is recorded there,
   * and it is still the file the commit stopped in.
   */
  snprintf (moved, sizeof moved, "%s/moved.img", dir);
  CHECK (rename (base_path, moved) == 0, "rename: %s", strerror (errno));
  make_overlay (moved, path, false);
  CHECK (mloop_overlay_file_discard (path, err, sizeof err) == -1,
         "an overlay whose commit stopped half-way was discarded once "
         "its base had moved");
  CHECK (access (path, F_OK) == 0, "the half-committed overlay was removed");
  CHECK (rename (moved, base_path) == 0, "rename: %s", strerror (errno));

  /* An overlay no commit has touched is discarded as before. */
  make_overlay (base_path, plain, false);
  CHECK (mloop_overlay_file_discard (plain, err, sizeof err) == 0,
         "discard: %s", err);
  CHECK (access (plain, F_OK) == -1 && errno == ENOENT,
         "the overlay was not removed");

  printf ("ok: an overlay whose commit stopped half-way is not discarded\n");
  return 0;
}
