/* mloop — who owns a device's nodes (device_owner.h). */
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "device_owner.h"
#include "errmsg.h"

/* The disk group's id, as udev gives block devices; root's without one. */
static gid_t
disk_group (void)
{
  struct group gr, *found = NULL;
  char buf[1024];

  if (getgrnam_r ("disk", &gr, buf, sizeof buf, &found) == 0 && found)
    return found->gr_gid;
  return 0;
}

static int
set_node (const char *name, uid_t owner, gid_t group, mode_t mode, char *err,
          size_t errlen)
{
  g_autofree char *node = g_strconcat ("/dev/", name, NULL);

  if (chown (node, owner, group) == -1 || chmod (node, mode) == -1)
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
