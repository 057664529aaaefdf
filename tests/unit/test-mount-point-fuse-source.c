/* A FUSE file system's source names no device: whoever mounts one says
 * what it is, and fusermount lets any user say "/dev/nbd3".  Such a
 * mount, made by a user who is neither root nor the device's owner,
 * must not make the device look mounted: detach (anyone's, root's too)
 * and a shrinking resize would be refused for as long as the user
 * keeps it.  A FUSE mount by root or by the device's owner still
 * counts, and so does any other file system whose source names the
 * device or a partition.
 * Root (it mounts in a mount namespace of its own, without a FUSE
 * server: nothing here reads the mounts): about 0.01 s, in the unit
 * suite of every tier; a SKIP without root, /dev/fuse or namespaces.
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
#include <unistd.h>

#include <glib.h>

#include "attach.h"
#include "unit.h"

#define USER_UID 65534
#define OTHER_UID 1

static const char *top;

/* Leaves the test's directory as it was made, for its removal. */
static void
unmount_top (void)
{
  umount2 (top, MNT_DETACH);
}

/* A FUSE mount on DIR whose source is SOURCE, as uid MOUNTER made it:
 * a connection of its own (one is one file system), which stays open.
 */
static void
mount_fuse (const char *source, const char *dir, unsigned mounter)
{
  int fd = open ("/dev/fuse", O_RDWR | O_CLOEXEC);
  g_autofree char *opts =
    g_strdup_printf ("fd=%d,rootmode=40000,user_id=%u,group_id=%u", fd,
                     mounter, mounter);

  CHECK (fd != -1, "/dev/fuse: %s", strerror (errno));

  CHECK (mount (source, dir, "fuse.spoof", MS_NOSUID | MS_NODEV,
                opts) == 0, "mount fuse on %s: %s", dir, strerror (errno));
}

/* The directories made, kept until exit. */
static GPtrArray *made;

static const char *
subdir (const char *top, const char *name)
{
  char *path = g_build_filename (top, name, NULL);

  CHECK (mkdir (path, 0755) == 0, "mkdir %s: %s", path, strerror (errno));
  if (made == NULL)
    made = g_ptr_array_new_with_free_func (g_free);
  g_ptr_array_add (made, path);
  return path;
}

int
main (void)
{
  g_autofree char *node = NULL, *part = NULL, *mnt = NULL;
  const char *owner_dir, *root_dir;

  if (geteuid () != 0)
    unit_skip ("needs root: it mounts");
  if (unshare (CLONE_NEWNS) == -1)
    unit_skip ("no mount namespace: %s", strerror (errno));
  CHECK (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0,
         "make / private: %s", strerror (errno));
  if (access ("/dev/fuse", R_OK | W_OK) == -1)
    unit_skip ("/dev/fuse: %s", strerror (errno));
  top = unit_tmpdir ("/tmp");
  CHECK (mount ("none", top, "tmpfs", 0, "mode=0755") == 0, "tmpfs: %s",
         strerror (errno));
  atexit (unmount_top);
  /* The device's node, owned by USER_UID as an attach through the
   * service leaves it.
   */
  node = g_build_filename (top, "nbd3", NULL);
  part = g_strconcat (node, "p1", NULL);
  CHECK (mknod (node, S_IFBLK | 0600, makedev (43, 96)) == 0, "mknod: %s",
         strerror (errno));
  CHECK (chown (node, USER_UID, USER_UID) == 0, "chown: %s", strerror (errno));

  /* Another user's FUSE mount naming the device, then a partition. */
  mount_fuse (node, subdir (top, "other"), OTHER_UID);
  mount_fuse (part, subdir (top, "other-part"), OTHER_UID);
  mnt = mloop_device_mount_point (node);
  CHECK (mnt == NULL, "another user's FUSE mount whose source says %s "
         "makes it look mounted on %s", node, mnt);

  /* The owner's own FUSE mount on their device counts. */
  owner_dir = subdir (top, "owner");
  mount_fuse (node, owner_dir, USER_UID);
  mnt = mloop_device_mount_point (node);
  CHECK (mnt && g_str_has_suffix (mnt, "/owner"), "the owner's FUSE mount "
         "of %s is not seen: %s", node, mnt ? mnt : "(none)");
  g_clear_pointer (&mnt, g_free);
  CHECK (umount (owner_dir) == 0, "umount: %s",
         strerror (errno));

  /* Root's FUSE mount counts, whoever owns the node. */
  root_dir = subdir (top, "root");
  mount_fuse (part, root_dir, 0);
  mnt = mloop_device_mount_point (node);
  CHECK (mnt && g_str_has_suffix (mnt, "/root"), "root's FUSE mount of "
         "%s is not seen: %s", part, mnt ? mnt : "(none)");
  g_clear_pointer (&mnt, g_free);
  CHECK (umount (root_dir) == 0, "umount: %s",
         strerror (errno));

  /* Any other file system whose source names the device counts. */
  CHECK (mount (node, subdir (top, "tmpfs"), "tmpfs", 0, NULL) == 0,
         "tmpfs from %s: %s", node, strerror (errno));
  mnt = mloop_device_mount_point (node);
  CHECK (mnt && g_str_has_suffix (mnt, "/tmpfs"), "a mount of %s is not "
         "seen: %s", node, mnt ? mnt : "(none)");
  return 0;
}
