/* A commit whose /dev/loopN node is another loop device than the
 * /sys/block/loopN it read.  /sys/block is the host's in a container,
 * /dev is the container's own: `docker run --device /dev/loop3:/dev/loop0`
 * gives loop3's numbers the name loop0.  The loop check read loop0's
 * backing file from sysfs, then asked /dev/loop0 (LOOP_GET_STATUS64),
 * which answered for loop3, attached elsewhere: the loop device over
 * the base went unseen and the commit wrote under it.  A node whose
 * device number is not the one sysfs gives is not asked now: the check
 * falls back to the sysfs path, which names the base here, and refuses.
 *
 * Here: loop device A over the base (read-only, as a loop mount to
 * look inside it), loop device B over another image; the commit runs in
 * a mount namespace of its own whose /dev (a tmpfs) holds only A's
 * name, with B's numbers.  Needs root, two loop devices and mount
 * namespaces (else it skips).  About 0.1 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "overlay.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Exit codes of the child that commits. */
enum { COMMITTED = 0, REFUSED = 1, NAMED = 2, NO_NAMESPACE = 3 };

/* Commits OV into BASE in a mount namespace whose /dev holds only
 * NODE, made with the device number RDEV; the exit code says how it
 * went (NAMED: refused, naming NODE).
 */
static int
commit_with_node (const char *ov, const char *base, const char *node,
                  dev_t rdev)
{
  char err[1024];
  int status, r;
  pid_t pid = fork ();

  CHECK (pid != -1, "fork: %s", strerror (errno));
  if (pid == 0) {
    if (unshare (CLONE_NEWNS) == -1 ||
        mount (NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == -1 ||
        mount ("tmpfs", "/dev", "tmpfs", 0, "mode=0755") == -1 ||
        mknod (node, S_IFBLK | 0600, rdev) == -1) {
      fprintf (stderr, "no mount namespace of its own: %s\n",
               strerror (errno));
      _exit (NO_NAMESPACE);
    }
    r = mloop_overlay_merge (ov, base, false, false, err, sizeof err);
    if (r == 0)
      printf ("committed\n");
    else
      printf ("refused: %s\n", err);
    fflush (stdout);
    _exit (r == 0 ? COMMITTED : strstr (err, node) ? NAMED : REFUSED);
  }
  CHECK (waitpid (pid, &status, 0) == pid && WIFEXITED (status),
         "the commit did not end");
  return WEXITSTATUS (status);
}

int
main (void)
{
  const char *dir;
  char base[4096], other[4096], ov[4096], node_a[64], node_b[64];
  struct stat b;
  int held_a, held_b, r;

  unit_free_loop (node_a, sizeof node_a);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (base, sizeof base, "%s/base.img", dir);
  snprintf (other, sizeof other, "%s/other.img", dir);
  snprintf (ov, sizeof ov, "%s/overlay", dir);
  unit_make_image (base, BASE_SIZE);
  unit_make_image (other, BASE_SIZE);
  unit_make_overlay (base, ov);

  held_a = unit_loop_attach (node_a, base, true);
  unit_free_loop (node_b, sizeof node_b);
  held_b = unit_loop_attach (node_b, other, true);
  CHECK (stat (node_b, &b) == 0, "%s: %s", node_b, strerror (errno));

  r = commit_with_node (ov, base, node_a, b.st_rdev);
  if (r == NO_NAMESPACE)
    unit_skip ("no mount namespace with a /dev of its own");
  CHECK (r != COMMITTED, "the commit wrote %s under %s, asking %s's node, "
         "which is %s here", base, node_a, node_a, node_b);
  CHECK (r == NAMED, "the refusal does not name %s", node_a);
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the clusters were written under %s", node_a);
  close (held_b);
  close (held_a);
  printf ("ok: a loop device is asked only through its own node\n");
  return 0;
}
