/* A device node given back to root from a user is a new inode
 * (device/device_owner.c, renew_node).
 *
 * An nbd node's inode outlives every device connected at its index.
 * A user who put an inotify watch on it while it was theirs (0600)
 * kept it after the node went back to root: the kernel checks a
 * watch's rights only when it is added, so the user went on hearing of
 * each open and read of root's next device there.  Given back by
 * chown and chmod in place, the watch stayed on the node.
 *
 * A made-up block node in /dev stands in for /dev/nbdN (its device
 * number names no driver: nothing opens it).  Root, for mknod in /dev;
 * skipped where that is refused (a container without CAP_MKNOD).
 * About 0.01 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "device_owner.h"
#include "unit.h"

#define USER_UID 1000

int
main (void)
{
  char name[64], node[80], err[512];
  struct inotify_event *ev;
  char events[4096] __attribute__ ((aligned (8)));
  struct stat before, after;
  bool ignored = false;
  ssize_t n;
  int watch;

  unit_deadline (30);
  snprintf (name, sizeof name, "mloop-unit-node-%d", (int) getpid ());
  snprintf (node, sizeof node, "/dev/%s", name);
  if (geteuid () != 0)
    unit_skip ("needs root to make a node in /dev");
  if (mknod (node, S_IFBLK | 0600, makedev (240, 250)) == -1)
    unit_skip ("cannot make a block node in /dev: %s", strerror (errno));
  CHECK (chown (node, USER_UID, 0) == 0 && stat (node, &before) == 0,
         "%s: %s", node, strerror (errno));
  watch = inotify_init1 (IN_NONBLOCK | IN_CLOEXEC);
  CHECK (watch >= 0 && inotify_add_watch (watch, node, IN_ALL_EVENTS) >= 0,
         "inotify: %s", strerror (errno));

  if (mloop_device_owner_set (name, 0, err, sizeof err) == -1) {
    unlink (node);
    CHECK (false, "giving %s back: %s", node, err);
  }
  CHECK (stat (node, &after) == 0, "%s: %s", node, strerror (errno));
  unlink (node);
  CHECK (after.st_uid == 0 && (after.st_mode & 0777) == 0660 &&
         S_ISBLK (after.st_mode) && after.st_rdev == before.st_rdev,
         "the node given back is uid %u mode %o device %u:%u",
         (unsigned) after.st_uid, (unsigned) (after.st_mode & 07777),
         major (after.st_rdev), minor (after.st_rdev));
  CHECK (after.st_ino != before.st_ino,
         "the node given back to root is the inode the user watched");
  /* The user's watch went with the old inode. */
  while ((n = read (watch, events, sizeof events)) > 0)
    for (char *p = events; p < events + n; p += sizeof *ev + ev->len) {
      ev = (struct inotify_event *) p;
      ignored = ignored || (ev->mask & IN_IGNORED);
    }
  CHECK (ignored, "the user's watch was not dropped with the old inode");
  close (watch);

  printf ("ok: a node given back to root is a new inode\n");
  return 0;
}
