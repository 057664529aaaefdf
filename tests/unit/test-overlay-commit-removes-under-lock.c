/* `mloop overlay commit` removes the overlay while the merge still holds
 * the overlay's lock (device/overlay_file.c, engine/overlay_merge.c).
 * Were the lock let go first, a server started by hand in between would
 * take the free lock, accept the base (it reads the same) and answer
 * writes into a file about to be unlinked: every one of them lost, and
 * the commit reported success.
 *
 * Observed with inotify on the overlay file itself, whose events come
 * in order: its unlink (IN_ATTRIB, the link count) must come before the
 * last close of the merge's descriptors (the lock goes with the last
 * of them).  No root, no clock: about 0.05 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "align.h"
#include "backing.h"
#include "overlay.h"
#include "overlay_file.h"
#include "range_lock.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], err[512];
  char events[64 * 1024] __attribute__ ((aligned (8)));
  char *written = NULL;
  unsigned char byte;
  int fd, in, r, closes_after_unlink = 0;
  bool unlinked = false;
  ssize_t n;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, path);

  in = inotify_init1 (IN_NONBLOCK | IN_CLOEXEC);
  if (in == -1)
    unit_skip ("inotify: %s", strerror (errno));
  CHECK (inotify_add_watch (in, path, IN_ATTRIB | IN_CLOSE) >= 0,
         "inotify_add_watch %s: %s", path, strerror (errno));

  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  CHECK (r == 0, "commit: %s", err);
  free (written);
  CHECK (access (path, F_OK) == -1 && errno == ENOENT,
         "the overlay is still there after the commit");

  /* The merge did its job: the cluster is in the base. */
  fd = open (base_path, O_RDONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pread (fd, &byte, 1, 3 * MLOOP_OVERLAY_CLUSTER) == 1,
         "%s: %s", base_path, strerror (errno));
  close (fd);
  CHECK (byte == 0x5a, "the base holds 0x%02x, not the overlay's 0x5a",
         byte);

  n = read (in, events, sizeof events);
  CHECK (n > 0, "no inotify events: %s", n < 0 ? strerror (errno) : "none");
  for (char *p = events; p < events + n; ) {
    const struct inotify_event *ev = (const struct inotify_event *) p;

    if (ev->mask & IN_ATTRIB)
      unlinked = true;
    else if ((ev->mask & IN_CLOSE) && unlinked)
      closes_after_unlink++;
    p += sizeof *ev + ev->len;
  }
  close (in);
  CHECK (unlinked, "no unlink of the overlay seen");
  CHECK (closes_after_unlink > 0, "the overlay was removed after the merge "
         "let go of its lock: a server could have taken it in between and "
         "answered writes into a file about to vanish");
  printf ("ok: the commit removes the overlay under its lock\n");
  return 0;
}
