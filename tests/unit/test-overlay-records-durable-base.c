/* An overlay records only a base whose bytes are on disk
 * (engine/overlay.c, sync_base): the base is synced before the header
 * that names it, with its fingerprint and times, is.  Otherwise a base
 * just written in place (dd conv=notrunc, qemu-img convert -n, a
 * copy's last pages) and not yet written back could be recorded as
 * it read then; a power cut takes the base back to its old bytes,
 * perhaps with its new modification time already journaled, while the
 * overlay keeps every flushed write: the device would then show
 * clusters written over bytes the base no longer holds, and its check
 * (ends and times alike) might see nothing.
 *
 * This program's fsync() and fdatasync() stand in for the C library's
 * (the engine is linked in statically) and note whether the base was
 * synced before the overlay's first sync: when the overlay is made,
 * and when another image is adopted as its base.  No root, no clock:
 * about 0.03 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* The image being recorded, and what the syncs showed of it. */
static struct stat watched;
static bool base_synced, overlay_synced, base_synced_first;

static void
note_sync (int fd)
{
  struct stat st;

  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode))
    return;
  if (st.st_dev == watched.st_dev && st.st_ino == watched.st_ino)
    base_synced = true;
  else if (!overlay_synced) {
    overlay_synced = true;
    base_synced_first = base_synced;
  }
}

static int
sync_noted (int fd, long call)
{
  note_sync (fd);
  return unit_sync_really (fd, call);
}

/* Writes the middle of the image at PATH, left in the page cache, and
 * watches it from now on.
 */
static void
write_and_watch (const char *path)
{
  char buf[4096];
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (buf, 0x77, sizeof buf);
  CHECK (fd >= 0 && pwrite (fd, buf, sizeof buf, BASE_SIZE / 2) ==
         (ssize_t) sizeof buf && close (fd) == 0, "%s: %s", path,
         strerror (errno));
  CHECK (stat (path, &watched) == 0, "%s: %s", path, strerror (errno));
  base_synced = overlay_synced = base_synced_first = false;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], other_path[4096], path[4096], err[512];

  unit_sync_hook = sync_noted;
  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (other_path, sizeof other_path, "%s/other.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_image (other_path, BASE_SIZE);

  write_and_watch (base_path);
  unit_make_empty_overlay (base_path, path);
  CHECK (overlay_synced, "making the overlay never synced it");
  CHECK (base_synced_first, "the overlay was made, naming its base, "
         "before the base's own bytes were on disk");

  write_and_watch (other_path);
  CHECK (mloop_overlay_adopt (path, other_path, err, sizeof err) == 0,
         "adopt: %s", err);
  CHECK (overlay_synced, "adopting never synced the overlay");
  CHECK (base_synced_first, "another image was recorded as the base "
         "before its own bytes were on disk");

  printf ("ok: an overlay records only a base that is on disk\n");
  return 0;
}
