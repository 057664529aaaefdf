/* mloop — an image reached through a descriptor (held_image.h). */
#include <limits.h>
#include <string.h>
#include <sys/vfs.h>
#include <linux/magic.h>

#include "errmsg.h"
#include "held_image.h"

static int held_fd = -1;

void
mloop_held_image_set (int fd)
{
  held_fd = fd;
}

int
mloop_held_image_fd (void)
{
  return held_fd;
}

bool
mloop_is_held_image (const char *image)
{
  return image && strcmp (image, MLOOP_HELD_IMAGE_PATH) == 0;
}

const char *
mloop_held_image_pseudo_fs (int fd)
{
  static const struct {
    unsigned long magic;
    const char *name;
  } pseudo[] = {
    { PROC_SUPER_MAGIC, "proc" }, { SYSFS_MAGIC, "sysfs" },
    { DEBUGFS_MAGIC, "debugfs" }, { TRACEFS_MAGIC, "tracefs" },
    { SECURITYFS_MAGIC, "securityfs" }, { SELINUX_MAGIC, "selinuxfs" },
    { SMACK_MAGIC, "smackfs" }, { CGROUP_SUPER_MAGIC, "cgroup" },
    { CGROUP2_SUPER_MAGIC, "cgroup2" }, { BPF_FS_MAGIC, "bpf" },
    { EFIVARFS_MAGIC, "efivarfs" }, { PSTOREFS_MAGIC, "pstore" },
    { BINFMTFS_MAGIC, "binfmt_misc" }, { DEVPTS_SUPER_MAGIC, "devpts" },
    { NSFS_MAGIC, "nsfs" }, { PIPEFS_MAGIC, "pipefs" },
    { SOCKFS_MAGIC, "sockfs" }, { ANON_INODE_FS_MAGIC, "anon_inodefs" },
    { DEVMEM_MAGIC, "devmem" },
    { 0x62656570, "configfs" },           /* not in linux/magic.h */
    { 0x65735543, "fusectl" },            /* not in linux/magic.h */
  };
  struct statfs fs;

  if (fstatfs (fd, &fs) == -1)
    return NULL;
  for (size_t i = 0; i < sizeof pseudo / sizeof pseudo[0]; i++)
    if ((unsigned long) fs.f_type == pseudo[i].magic)
      return pseudo[i].name;
  return NULL;
}

int
mloop_held_image_label_check (const char *name, char *err, size_t errlen)
{
  size_t len = strlen (name);

  if (len >= PATH_MAX)
    return mloop_fail (err, errlen, "the image's name is %zu bytes long: "
                       "a path has at most %d", len, PATH_MAX - 1);
  if (name[0] != '/' || strchr (name, '\n'))
    return mloop_fail (err, errlen, "%s: the image's name must be an "
                       "absolute path on one line", name);
  return 0;
}
