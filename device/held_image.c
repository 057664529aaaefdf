/* mloop — an image reached through a descriptor (held_image.h). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>

#include <glib.h>

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
    /* A message queue, which a user may make wherever mqueue is
     * mounted (/dev/mqueue): a regular file whose text is the queue's
     * state, its notified pid as the reader's pid namespace numbers it.
     */
    { 0x19800202, "mqueue" },             /* not in linux/magic.h */
  };
  struct statfs fs;

  if (fstatfs (fd, &fs) == -1)
    return NULL;
  for (size_t i = 0; i < sizeof pseudo / sizeof pseudo[0]; i++)
    if ((unsigned long) fs.f_type == pseudo[i].magic)
      return pseudo[i].name;
  return NULL;
}

const char *
mloop_held_image_memory_fs (int fd)
{
  struct statfs fs;

  if (fstatfs (fd, &fs) == -1)
    return NULL;
  switch ((unsigned long) fs.f_type) {
  case TMPFS_MAGIC:
    return "tmpfs";
  case RAMFS_MAGIC:
    return "ramfs";
  case HUGETLBFS_MAGIC:
    return "hugetlbfs";
  default:
    return NULL;
  }
}

/* Whether mountinfo LINE is of a FUSE file system a user mounted: its
 * file system type, after " - ", is fuse, fuseblk or fuse.NAME, and its
 * super options say a user_id other than root's, or the process whose
 * mounts these are is in a user namespace other than this process's
 * (OTHER_NS): the kernel gives user_id as the namespace the file system
 * was mounted in numbers it, so a user who is root in one of their own
 * (unshare -Urm) shows 0 for a server they run.  *MOUNTER: the
 * user_id given.
 */
static bool
users_fuse_line (const char *line, bool other_ns, unsigned *mounter)
{
  const char *dash = strstr (line, " - ");
  g_auto (GStrv) f = NULL;
  g_auto (GStrv) opts = NULL;

  if (dash == NULL)
    return false;
  f = g_strsplit (dash + 3, " ", 3);
  if (g_strv_length (f) < 3 || !(strcmp (f[0], "fuse") == 0 ||
                                 strcmp (f[0], "fuseblk") == 0 ||
                                 g_str_has_prefix (f[0], "fuse.")))
    return false;
  opts = g_strsplit (f[2], ",", -1);
  for (char **o = opts; *o; o++) {
    guint64 uid;

    if (g_str_has_prefix (*o, "user_id=") &&
        g_ascii_string_to_unsigned (*o + 8, 10, 0, G_MAXUINT32, &uid, NULL)) {
      *mounter = (unsigned) uid;
      return uid != 0 || other_ns;
    }
  }
  /* FUSE always says who mounted it: without it, trust nobody. */
  *mounter = (unsigned) -1;
  return true;
}

/* Whether mountinfo LINE is of an overlay file system: its type, the
 * first field after " - " (no field before it holds a space: the
 * kernel escapes those of paths), is overlay.
 */
static bool
overlay_line (const char *line)
{
  const char *dash = strstr (line, " - ");

  return dash && strncmp (dash + 3, "overlay ", 8) == 0;
}

/* The contents of NAME in the directory open at DIR, up to 64 KiB, or
 * NULL.
 */
static char *
read_at (int dir, const char *name)
{
  const size_t size = 64 << 10;
  g_autofree char *buf = g_malloc (size);
  size_t len = 0;
  ssize_t n;
  int fd = openat (dir, name, O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    return NULL;
  while (len < size - 1 &&
         (n = read (fd, buf + len, size - 1 - len)) > 0)
    len += (size_t) n;
  close (fd);
  buf[len] = '\0';
  return g_steal_pointer (&buf);
}

/* Whether the process whose /proc directory is open at PROC is in a
 * user namespace other than this process's: then the mounts it sees
 * may be its user's own, made where they are root.  Its uid_map
 * (which needs no right to trace it: this service has none) reads as
 * this process's own only from this namespace, or from one root made
 * with the same map.  When it cannot be read, it is taken to be in one.
 */
static bool
in_other_user_ns (int proc)
{
  g_autofree char *theirs = read_at (proc, "uid_map");
  g_autofree char *mine = read_at (AT_FDCWD, "/proc/self/uid_map");

  return theirs == NULL || mine == NULL || strcmp (theirs, mine) != 0;
}

/* Whether mountinfo LINE's field FIELD (0: the mount's id, 2: its
 * device number) is WANT.
 */
static bool
field_is (const char *line, unsigned field, const char *want)
{
  size_t len = strlen (want);

  for (; field > 0 && line; field--) {
    line = strchr (line, ' ');
    line = line ? line + 1 : NULL;
  }
  return line && strncmp (line, want, len) == 0 && line[len] == ' ';
}

/* The next line of F into LINE, without its newline and cut to
 * MLOOP_HELD_MOUNTINFO_LINE_MAX bytes (*CUT says whether it was),
 * counting the bytes read in *TOTAL: false at the end, or once *TOTAL
 * passes MLOOP_HELD_MOUNTINFO_MAX.  One line at a time: the file is
 * the caller's to make long (held_image.h).
 */
static bool
next_line (FILE *f, GString *line, bool *cut, size_t *total)
{
  int c;

  g_string_truncate (line, 0);
  *cut = false;
  while ((c = getc_unlocked (f)) != EOF) {
    if (++*total > MLOOP_HELD_MOUNTINFO_MAX)
      return false;
    if (c == '\n')
      return true;
    if (line->len < MLOOP_HELD_MOUNTINFO_LINE_MAX)
      g_string_append_c (line, (char) c);
    else
      *cut = true;
  }
  return line->len > 0;
}

enum mloop_held_mount
mloop_held_image_mount (pid_t pid, uint64_t mnt_id, unsigned major,
                        unsigned minor, unsigned *mounter)
{
  const bool by_id = pid > 0 && mnt_id > 0;
  g_autofree char *path = by_id ? g_strdup_printf ("/proc/%d", (int) pid)
    : g_strdup ("/proc/self");
  g_autofree char *want = by_id
    ? g_strdup_printf ("%" G_GUINT64_FORMAT, mnt_id)
    : g_strdup_printf ("%u:%u", major, minor);
  g_autoptr (GString) line = g_string_new (NULL);
  /* By device number, a file system mounted nowhere here may still be
   * one (a btrfs subvolume's files have a number of their own): only a
   * user's FUSE is known for one.
   */
  enum mloop_held_mount found = by_id ? MLOOP_HELD_MOUNT_UNSEEN
    : MLOOP_HELD_MOUNT_SEEN;
  size_t total = 0;
  bool cut, other_ns;
  /* The process's directory, opened once: its pid, were it to exit,
   * could be another process's by the time a second file is opened.
   */
  int proc = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int fd = proc == -1 ? -1 : openat (proc, "mountinfo", O_RDONLY | O_CLOEXEC);
  FILE *f = fd == -1 ? NULL : fdopen (fd, "re");

  if (f == NULL) {
    if (fd != -1)
      close (fd);
    if (proc != -1)
      close (proc);
    return MLOOP_HELD_MOUNT_UNSEEN;
  }
  for (;;) {
    if (!next_line (f, line, &cut, &total)) {
      if (total > MLOOP_HELD_MOUNTINFO_MAX)
        found = MLOOP_HELD_MOUNT_TOO_MANY;
      break;
    }
    if (!field_is (line->str, by_id ? 0 : 2, want))
      continue;
    if (cut) {
      found = MLOOP_HELD_MOUNT_TOO_MANY;
      break;
    }
    /* Whether the caller is in a user namespace of its own, where its
     * user may be root.  By device number, the mounts looked at are
     * this process's own.
     */
    other_ns = by_id && in_other_user_ns (proc);
    if (users_fuse_line (line->str, other_ns, mounter)) {
      found = MLOOP_HELD_MOUNT_USERS_FUSE;
      break;
    }
    if (other_ns && overlay_line (line->str)) {
      found = MLOOP_HELD_MOUNT_USERS_OVERLAY;
      break;
    }
    if (by_id) {
      found = MLOOP_HELD_MOUNT_SEEN;
      break;
    }
  }
  fclose (f);
  close (proc);
  return found;
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
