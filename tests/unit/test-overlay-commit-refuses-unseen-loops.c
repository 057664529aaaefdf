/* A commit that cannot look for loop devices over its base: no sysfs,
 * as in a container that mounts none.  The loop check read /sys/block
 * and, failing to open it, went on as though no loop device held the
 * base, and wrote under any that did.  Refused now in one line naming
 * /sys/block, the base left alone; with sysfs back, the commit goes on.
 *
 * Needs root (a private mount namespace to hide /sys in), else it
 * skips.  About 0.05 s.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Hides sysfs under an empty tmpfs, in a mount namespace of this
 * process's own (unmounting it may only uncover another sysfs mounted
 * below, as in the test VM): 0, or 3 when it cannot.
 */
static int
hide_sysfs (void *unused)
{
  if (unshare (CLONE_NEWNS) == -1 ||
      mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == -1 ||
      mount ("tmpfs", "/sys", "tmpfs", 0, "mode=0755") == -1) {
    fprintf (stderr, "cannot hide /sys privately: %s\n",
             strerror (errno));
    return 3;
  }
  return 0;
}

int
main (void)
{
  char base[4096], ov[4096], err[1024];
  const char *dir;
  int r;

  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (base, sizeof base, "%s/base.img", dir);
  snprintf (ov, sizeof ov, "%s/a.overlay", dir);
  unit_make_image (base, BASE_SIZE);
  unit_make_overlay (base, ov);

  r = unit_commit_in_child (ov, base, hide_sysfs, NULL, "/sys/block");
  if (r == 3)
    unit_skip ("no private mount namespace here");
  CHECK (r != 0, "a commit that could not look for loop devices wrote %s",
         base);
  CHECK (r == 1, "the refusal does not name /sys/block");
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the clusters were written");
  CHECK (access (ov, F_OK) == 0, "the overlay was removed");

  CHECK (mloop_overlay_merge (ov, base, false, true, err, sizeof err) == 0,
         "the commit with sysfs was refused: %s", err);
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write %s", base);
  printf ("ok: a commit that cannot look for loop devices refuses\n");
  return 0;
}
