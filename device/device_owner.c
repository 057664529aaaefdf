/* mloop — who owns a device's nodes (device_owner.h). */
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <glib.h>

#include "device_owner.h"
#include "errmsg.h"
#include "nbd_netlink.h"
#include "nbd_sysfs.h"
#include "user_db.h"

/* The disk group's id, as udev gives block devices; root's without one.
 * Looked up however large its entry (user_db.h): a group with many
 * members is still the disk group, and a lookup that failed would give
 * nodes back to root's own group and take udev's nodes for not root's.
 */
static gid_t
disk_group (void)
{
  struct group gr;
  g_autofree char *buf = NULL;

  return mloop_group_by_name ("disk", &gr, &buf) == 0 ? gr.gr_gid : 0;
}

/* The extended attribute that holds a file's access ACL.  The owner of
 * a node may set one (/dev keeps them, as logind's seat ACLs show), and
 * it outlives chown and chmod: an entry naming a user, with the mask
 * that chmod 0660 sets, would let them open the node whoever owns it.
 */
#define ACCESS_ACL "system.posix_acl_access"

/* Whether NODE has an access ACL beyond its mode bits (the kernel
 * keeps none that the mode says all of).
 */
static bool
has_acl (const char *node)
{
  return getxattr (node, ACCESS_ACL, NULL, 0) >= 0 ||
    !(errno == ENODATA || errno == EOPNOTSUPP);
}

/* Owner first, so that the one before can no longer set an ACL, then
 * the ACL gone, then the mode.
 */
static int
set_node (const char *name, uid_t owner, gid_t group, mode_t mode, char *err,
          size_t errlen)
{
  g_autofree char *node = g_strconcat ("/dev/", name, NULL);

  if (chown (node, owner, group) == -1 ||
      (removexattr (node, ACCESS_ACL) == -1 && errno != ENODATA &&
       errno != EOPNOTSUPP) ||
      chmod (node, mode) == -1)
    return mloop_fail (err, errlen, "cannot give %s to uid %u: %s", node,
                       (unsigned) owner, strerror (errno));
  return 0;
}

int
mloop_device_owner_set (const char *name, uid_t owner, char *err,
                        size_t errlen)
{
  const gid_t group = owner ? (gid_t) 0 : disk_group ();
  const mode_t mode = owner ? 0600 : 0660;
  g_autofree char *sys = g_strconcat ("/sys/block/", name, NULL);
  DIR *dir;
  struct dirent *e;
  int r;

  /* The whole device, then each partition the kernel made of it. */
  r = set_node (name, owner, group, mode, err, errlen);
  if (r == -1 || (dir = opendir (sys)) == NULL)
    return r;
  while ((e = readdir (dir)) != NULL)
    if (g_str_has_prefix (e->d_name, name) &&
        set_node (e->d_name, owner, group, mode, err, errlen) == -1)
      r = -1;
  closedir (dir);
  return r;
}

/* mloop_device_owner_is_root() with the disk group's id DISK, which a
 * scan of every device looks up once: each lookup reads the group
 * database, and under emulation a scan of 16 devices spent tens of
 * milliseconds of every attach there.
 */
static bool
node_is_root (const char *name, gid_t disk)
{
  g_autofree char *node = g_strconcat ("/dev/", name, NULL);
  struct stat st;

  if (stat (node, &st) == -1 || st.st_uid != 0 || (st.st_mode & 0007) ||
      has_acl (node))
    return false;
  /* Group bits are the disk group's, or root's own group's. */
  return st.st_gid == 0 || st.st_gid == disk || !(st.st_mode & 0070);
}

bool
mloop_device_owner_is_root (const char *name)
{
  return node_is_root (name, disk_group ());
}

/* Whether the kernel says device INDEX is not connected.  A device with
 * a receiving task (sysfs "pid") is connected: no need to ask.
 */
static bool
idle (int index)
{
  bool connected = true;
  char why[512];

  if (mloop_nbd_sysfs_started (index))
    return false;
  return mloop_nbd_netlink_connected (index, &connected, why,
                                      sizeof why) == 0 && !connected;
}

static gint
compare_ints (gconstpointer a, gconstpointer b)
{
  const int x = *(const int *) a, y = *(const int *) b;

  return (x > y) - (x < y);
}

GArray *
mloop_device_owner_candidates (int from)
{
  DIR *dir = opendir ("/sys/block");
  GArray *found = g_array_new (FALSE, FALSE, sizeof (int));
  const gid_t disk = disk_group ();
  struct dirent *e;
  char why[512];
  guint kept = 0;

  if (dir == NULL)
    return found;
  while ((e = readdir (dir)) != NULL) {
    char *end;
    long index;
    int n;

    if (!g_str_has_prefix (e->d_name, "nbd"))
      continue;
    index = strtol (e->d_name + 3, &end, 10);
    if (end == e->d_name + 3 || *end != '\0' || index < 0 ||
        index > INT_MAX)
      continue;
    /* The nodes a device left its user's, once the kernel let it go. */
    if (!node_is_root (e->d_name, disk) && idle ((int) index))
      mloop_device_owner_set (e->d_name, 0, why, sizeof why);
    if (index < from)
      continue;
    n = (int) index;
    g_array_append_val (found, n);
  }
  closedir (dir);
  g_array_sort (found, compare_ints);
  for (guint i = 0; i < found->len; i++) {
    int index = g_array_index (found, int, i);
    g_autofree char *name = g_strdup_printf ("nbd%d", index);

    if (node_is_root (name, disk))
      g_array_index (found, int, kept++) = index;
  }
  g_array_set_size (found, kept);
  return found;
}

bool
mloop_device_owner_idle (int index)
{
  return idle (index);
}

int
mloop_device_owner_reclaim_idle (int from)
{
  g_autoptr (GArray) found = mloop_device_owner_candidates (from);

  /* The lowest idle device from FROM on whose node is root's. */
  for (guint i = 0; i < found->len; i++)
    if (idle (g_array_index (found, int, i)))
      return g_array_index (found, int, i);
  return -1;
}
