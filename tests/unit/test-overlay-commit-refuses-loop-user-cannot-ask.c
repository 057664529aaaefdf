/* A commit by a user who cannot open /dev/loopN (not root, outside the
 * disk group) into an image a loop device is attached to by a name
 * since removed (a hard link, unlinked: `mount -o loop,ro` of a
 * snapshot's name, then the snapshot pruned).  Such a user cannot ask
 * the device what it holds (LOOP_GET_STATUS64), and the loop check fell
 * back to the sysfs backing_file path, which then ends in " (deleted)"
 * and leads nowhere: the loop device went unseen and the commit wrote
 * under it.  Refused now, naming the device; and once the loop device
 * is gone, the same commit goes on.
 *
 * Needs root (to attach the loop device, and to run the commit as
 * nobody's uid) and loop devices, else it skips.  About 0.1 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define USER 65534

/* Becomes USER, who must not be able to open the loop device NODE
 * (unless NULL): 0, 3 when USER can open it after all, 4 when this
 * process cannot become USER.
 */
static int
become_user (void *node)
{
  if (setgroups (0, NULL) == -1 || setresgid (USER, USER, USER) == -1 ||
      setresuid (USER, USER, USER) == -1) {
    fprintf (stderr, "cannot become uid %d: %s\n", USER, strerror (errno));
    return 4;
  }
  if (node != NULL && open (node, O_RDONLY | O_CLOEXEC) >= 0)
    return 3;
  return 0;
}

/* Commits OV into BASE as USER: 0 committed, 1 refused naming NODE,
 * 2 refused otherwise, 3 NODE could be opened by USER after all.
 */
static int
commit_as_user (const char *ov, const char *base, const char *node)
{
  int r = unit_commit_in_child (ov, base, become_user, (void *) node, node);

  CHECK (r != 4, "cannot run as uid %d", USER);
  return r;
}

int
main (void)
{
  const char *dir;
  char users[4096], base[4096], gone[4096], ov[4096], node[64],
    backing[4096];
  int held, r;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (users, sizeof users, "%s/user", dir);
  snprintf (base, sizeof base, "%s/user/base.img", dir);
  snprintf (gone, sizeof gone, "%s/user/gone.img", dir);
  snprintf (ov, sizeof ov, "%s/user/a.overlay", dir);
  CHECK (chmod (dir, 0755) == 0 && mkdir (users, 0755) == 0 &&
         chown (users, USER, USER) == 0, "%s: %s", users, strerror (errno));
  unit_make_image (base, BASE_SIZE);
  CHECK (chown (base, USER, USER) == 0, "%s: %s", base, strerror (errno));
  unit_make_overlay (base, ov);
  CHECK (chown (ov, USER, USER) == 0, "%s: %s", ov, strerror (errno));

  /* Attached by a second name of the base, that name removed since. */
  CHECK (link (base, gone) == 0, "%s: %s", gone, strerror (errno));
  held = unit_loop_attach (node, gone, true);
  CHECK (unlink (gone) == 0, "%s: %s", gone, strerror (errno));

  r = commit_as_user (ov, base, node);
  if (r == 3)
    unit_skip ("uid %d may open %s", USER, node);
  CHECK (r != 0, "the commit as a user who cannot ask %s wrote %s under "
         "it, attached by a removed name", node, base);
  CHECK (r == 1, "the refusal does not name %s", node);
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the clusters were written under %s", node);
  CHECK (access (ov, F_OK) == 0, "the overlay was removed");

  /* The loop device gone, the same commit goes on. */
  close (held);
  snprintf (backing, sizeof backing, "/sys/block/%s/loop/backing_file",
            node + strlen ("/dev/"));
  for (int i = 0; access (backing, F_OK) == 0; i++) {
    CHECK (i < 100, "%s stays attached", node);
    unit_sleep_ms (20);
  }
  r = commit_as_user (ov, base, NULL);
  CHECK (r == 0, "the commit as uid %d was refused with no loop device "
         "left", USER);
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write %s", base);
  printf ("ok: a commit that cannot ask a loop device over a removed name "
          "refuses\n");
  return 0;
}
