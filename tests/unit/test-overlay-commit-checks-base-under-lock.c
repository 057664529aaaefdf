/* A commit checks that the base is the overlay's while it holds the
 * base's exclusive lock (engine/overlay_merge.c).  Every server reading
 * or writing the base holds it shared, so the lock is what keeps the
 * base as checked; a check made before the lock passes a base that a
 * writer (a plain server on the image, a `dd`) changed in between and
 * let go of, and the merge then writes the overlay's clusters into
 * an image they were never made over.
 *
 * The window is made certain, not raced for: this program's fcntl()
 * stands in for the C library's (the engine is linked in statically)
 * and, just before the base's exclusive lock is taken, writes the
 * base's first MiB as such a writer would.  No root, no clock: about
 * 0.03 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

static const char *base_path;
static struct stat base_st;
static bool written;

/* The engine's fcntl(): writes the base just before its exclusive lock
 * (mloop_lock_image).
 */
int
fcntl (int fd, int cmd, ...)
{
  va_list ap;
  void *arg;
  struct stat st;

  va_start (ap, cmd);
  arg = va_arg (ap, void *);
  va_end (ap);
  if (!written && cmd == F_OFD_SETLK &&
      ((struct flock *) arg)->l_type == F_WRLCK && fstat (fd, &st) == 0 &&
      st.st_dev == base_st.st_dev && st.st_ino == base_st.st_ino) {
    int w = open (base_path, O_WRONLY | O_CLOEXEC);

    written = true;
    CHECK (w >= 0 && pwrite (w, "another image", 13, 512) == 13 &&
           close (w) == 0, "writing %s: %s", base_path, strerror (errno));
  }
  return (int) syscall (SYS_fcntl, fd, cmd, arg);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base[4096], path[4096], err[512], at[MLOOP_OVERLAY_CLUSTER];
  int fd, r;

  unit_deadline (30);
  snprintf (base, sizeof base, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  base_path = base;
  unit_make_image (base, BASE_SIZE);
  CHECK (stat (base, &base_st) == 0, "%s: %s", base, strerror (errno));
  unit_make_overlay (base, path);

  r = mloop_overlay_merge (path, base, false, true, err, sizeof err);
  CHECK (written, "the merge took no exclusive lock of the base");
  CHECK (r < 0, "a commit wrote its overlay into a base written between "
         "its identity check and its lock");
  CHECK (strstr (err, "first or last MiB differ") != NULL,
         "the refusal does not say the base changed: %s", err);
  CHECK (access (path, F_OK) == 0, "the overlay was removed");
  fd = open (base, O_RDONLY | O_CLOEXEC);
  CHECK (fd >= 0 && pread (fd, at, sizeof at, UNIT_OVERLAY_CLUSTER_AT) ==
         (ssize_t) sizeof at && close (fd) == 0, "%s: %s", base,
         strerror (errno));
  for (size_t i = 0; i < sizeof at; i++)
    CHECK (at[i] == 0, "the overlay's cluster was written into the base");

  printf ("ok: a commit checks its base under the base's lock\n");
  return 0;
}
