/* A node given back to root is root's and the disk group's, however
 * large the disk group's entry in the group database: a group with
 * many members (a site's directory may give it hundreds) did not fit
 * a fixed buffer, its lookup failed, and the node went to root's own
 * group instead, out of the disk group's reach; and a node udev made,
 * root's and the disk group's, was then not root's to the attach, which
 * takes such a node back, or refuses and disconnects a device just
 * connected.
 * Root (it binds a group file of its own over /etc/group in a mount
 * namespace of its own, and makes a node in /dev): about 0.01 s, in the
 * unit suite of every tier; a SKIP without root, namespaces or a disk
 * group.
 */
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <glib.h>

#include "device_owner.h"
#include "unit.h"

#define USER_UID 65534
#define MEMBERS 400

/* The machine's /etc/group with the disk group's entry given MEMBERS
 * members (about 5 KB), into a file under DIR bound over /etc/group
 * for this process only; the disk group's id.
 */
static gid_t
bind_large_disk_group (const char *dir)
{
  g_autofree char *text = NULL;
  g_autofree char *path = g_build_filename (dir, "group", NULL);
  g_auto (GStrv) lines = NULL;
  g_autoptr (GString) out = g_string_new (NULL);
  struct group *gr = getgrnam ("disk");
  gid_t disk;

  if (gr == NULL)
    unit_skip ("no disk group here");
  disk = gr->gr_gid;
  CHECK (g_file_get_contents ("/etc/group", &text, NULL, NULL),
         "cannot read /etc/group");
  lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l; l++) {
    if (**l == '\0')
      continue;
    if (!g_str_has_prefix (*l, "disk:")) {
      g_string_append_printf (out, "%s\n", *l);
      continue;
    }
    g_string_append_printf (out, "disk:x:%u:", (unsigned) disk);
    for (int i = 0; i < MEMBERS; i++)
      g_string_append_printf (out, "%smloop-member-%d", i ? "," : "", i);
    g_string_append_c (out, '\n');
  }
  CHECK (g_file_set_contents (path, out->str, (gssize) out->len, NULL),
         "cannot write %s", path);
  if (unshare (CLONE_NEWNS) == -1)
    unit_skip ("unshare: %s", strerror (errno));
  CHECK (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0,
         "mount --make-rprivate /: %s", strerror (errno));
  CHECK (mount (path, "/etc/group", "none", MS_BIND, NULL) == 0,
         "bind %s over /etc/group: %s", path, strerror (errno));
  gr = getgrnam ("disk");
  CHECK (gr && gr->gr_gid == disk && gr->gr_mem[MEMBERS - 1] != NULL,
         "the bound group file does not give disk %d members", MEMBERS);
  return disk;
}

int
main (void)
{
  char name[64], node[80], err[512];
  struct stat st;
  gid_t disk;

  unit_deadline (10);
  if (geteuid () != 0)
    unit_skip ("needs root, to bind over /etc/group and make a node");
  disk = bind_large_disk_group (unit_tmpdir ("/tmp"));
  snprintf (name, sizeof name, "mloop-unit-disk-%d", (int) getpid ());
  snprintf (node, sizeof node, "/dev/%s", name);
  if (mknod (node, S_IFBLK | 0660, makedev (7, 250)) == -1)
    unit_skip ("mknod %s: %s", node, strerror (errno));
  unit_remove_at_exit (node);

  /* As udev makes a block device's node. */
  CHECK (chown (node, 0, disk) == 0, "%s", strerror (errno));
  CHECK (mloop_device_owner_is_root (name),
         "a node of root's and the disk group's, mode 0660, is not root's");

  CHECK (mloop_device_owner_set (name, USER_UID, err, sizeof err) == 0,
         "%s", err);
  CHECK (mloop_device_owner_set (name, 0, err, sizeof err) == 0, "%s", err);
  CHECK (stat (node, &st) == 0, "%s", strerror (errno));
  CHECK (st.st_uid == 0 && st.st_gid == disk && (st.st_mode & 0777) == 0660,
         "a node given back is uid %u gid %u mode %o, not root's and the "
         "disk group's (%u), 0660", (unsigned) st.st_uid,
         (unsigned) st.st_gid, (unsigned) (st.st_mode & 0777),
         (unsigned) disk);

  printf ("ok: a node given back is the disk group's, whose entry is "
          "large\n");
  return 0;
}
