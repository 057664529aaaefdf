/* `mloop overlay commit` of an overlay whose base its caller may not
 * write (engine/overlay_merge.c).  Opening an image for writing falls
 * back to reading it when the open for writing is refused (EACCES,
 * EROFS, EPERM: mloop_backing_open), which suits a server but not a
 * merge: it would go on, mark the overlay's header as half-merged, and
 * only then fail its first write into the base, with EBADF.  The mark
 * makes discard refuse the overlay for good ("finish the commit"), a
 * commit that can never finish.  The merge must refuse such a base
 * before marking anything, and say why.
 *
 * The caller is an ordinary user with a base it may only read (as root,
 * the test takes the ids of nobody, 65534, first).  About 0.02 s, in
 * the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "align.h"
#include "backing.h"
#include "overlay.h"
#include "range_lock.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define NOBODY 65534

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], err[512];
  char *recorded = NULL;
  uint64_t size;
  bool known, merging = true;
  int fd, r;

  unit_deadline (30);
  if (geteuid () == 0 &&
      (chown (dir, NOBODY, NOBODY) == -1 || setgroups (0, NULL) == -1 ||
       setgid (NOBODY) == -1 || setuid (NOBODY) == -1))
    unit_skip ("cannot take the ids of nobody: %s", strerror (errno));
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, path);
  CHECK (chmod (base_path, 0444) == 0, "chmod: %s", strerror (errno));
  fd = open (base_path, O_RDWR | O_CLOEXEC);
  if (fd != -1)
    unit_skip ("a file of mode 0444 is writable here (CAP_DAC_OVERRIDE)");

  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0, "a commit into a base its caller may not write succeeded");
  CHECK (r != -EBADF && strstr (err, base_path) != NULL,
         "the refusal does not say the base cannot be written: %s", err);
  CHECK (access (path, F_OK) == 0, "the overlay was removed");

  /* Nothing was written into the base: the overlay carries no mark, and
   * discard may still remove it.
   */
  fd = open (path, O_RDONLY | O_CLOEXEC);
  CHECK (fd >= 0, "%s: %s", path, strerror (errno));
  CHECK (mloop_overlay_inspect_fd (fd, path, &recorded, &size, &known,
                                   &merging, err, sizeof err) == 0,
         "inspect: %s", err);
  close (fd);
  free (recorded);
  CHECK (!merging, "a commit that wrote nothing marked the overlay as "
         "half-merged, which discard then refuses for good");

  printf ("ok: a commit into a base its caller may not write is refused "
          "before marking anything\n");
  return 0;
}
