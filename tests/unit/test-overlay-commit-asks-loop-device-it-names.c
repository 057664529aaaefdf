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
#include <stdbool.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "overlay.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* The device number the commit's /dev gives NODE (enter_private_dev),
 * and what the commit's process finds: whether the path sysfs gives for
 * the backing file of the loop device BASE_NODE leads to BASE there (in
 * memory shared with the test).
 */
struct private_dev {
  const char *node;
  dev_t rdev;
  const char *base_node, *base;
  bool *leads_to_base;
};

static bool backing_path_leads_to (const char *node, const char *base);

/* Enters a mount namespace whose /dev holds only the node ARG names:
 * 0, or 3 when it cannot.
 */
static int
enter_private_dev (void *arg)
{
  const struct private_dev *p = arg;

  if (unshare (CLONE_NEWNS) == -1 ||
      mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == -1 ||
      mount ("tmpfs", "/dev", "tmpfs", 0, "mode=0755") == -1 ||
      mknod (p->node, S_IFBLK | 0600, p->rdev) == -1) {
    fprintf (stderr, "no mount namespace of its own: %s\n",
             strerror (errno));
    return 3;
  }
  *p->leads_to_base = backing_path_leads_to (p->base_node, p->base);
  return 0;
}

/* Whether the path sysfs shows for the loop device NODE's backing file
 * leads to BASE here: not in a mount namespace of the test VM's guest,
 * which runs chrooted into the host's files, where the kernel spells
 * a path from outside the namespace from the guest's own root.
 */
static bool
backing_path_leads_to (const char *node, const char *base)
{
  char path[128], backing[4096];
  struct stat a, b;
  size_t n;
  FILE *f;

  snprintf (path, sizeof path, "/sys/block/%s/loop/backing_file",
            node + strlen ("/dev/"));
  if ((f = fopen (path, "re")) == NULL)
    return false;
  n = fread (backing, 1, sizeof backing - 1, f);
  fclose (f);
  backing[n] = '\0';
  backing[strcspn (backing, "\n")] = '\0';
  return stat (backing, &a) == 0 && stat (base, &b) == 0 &&
    a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int
main (void)
{
  const char *dir;
  char base[4096], other[4096], ov[4096], node_a[64], node_b[64];
  struct stat b;
  bool *leads_to_base;
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

  leads_to_base = mmap (NULL, sizeof *leads_to_base, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK (leads_to_base != MAP_FAILED, "mmap: %s", strerror (errno));
  r = unit_commit_in_child (ov, base, enter_private_dev,
                            &(struct private_dev) { node_a, b.st_rdev,
                                                    node_a, base,
                                                    leads_to_base },
                            node_a);
  if (r == 3)
    unit_skip ("no mount namespace with a /dev of its own");
  CHECK (r != 0, "the commit wrote %s under %s, asking %s's node, which is "
         "%s here", base, node_a, node_a, node_b);
  /* Where sysfs's paths lead nowhere, every loop device that cannot be
   * asked refuses the commit, whichever comes first.
   */
  CHECK (r == 1 || !*leads_to_base, "the refusal does not name %s", node_a);
  CHECK (unit_byte_at (base, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the clusters were written under %s", node_a);
  close (held_b);
  close (held_a);
  printf ("ok: a loop device is asked only through its own node\n");
  return 0;
}
