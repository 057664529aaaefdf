/* mloop — folding a copy-on-write overlay into its base (`mloop overlay
 * commit`), and giving it another (`mloop overlay adopt`).  See
 * overlay.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <linux/kcmp.h>
#include <linux/loop.h>
#include <linux/openat2.h>

#include "backing.h"
#include "fileio.h"
#include "overlay.h"
#include "owner_access.h"

/* Copied a run of clusters at a time, at most this much. */
#define MERGE_CHUNK (1u << 20)

static uint64_t
cluster_bytes (const struct mloop_overlay *ov, uint64_t pos)
{
  return ov->size - pos < MLOOP_OVERLAY_CLUSTER ? ov->size - pos
    : MLOOP_OVERLAY_CLUSTER;
}

static bool
in_overlay (const struct mloop_overlay *ov, uint64_t pos)
{
  return mloop_overlay_where (ov, pos, cluster_bytes (ov, pos)) ==
    MLOOP_OVERLAY_IN_OVERLAY;
}

/* Gives BASE, a regular file, a new modification time and makes it
 * durable, before the merge's first write into it.  That time is how
 * every other overlay made over the base tells it was written since;
 * the bytes written in place reach the disk as the kernel writes them
 * back (at once, under the pressure of a large merge), the time the
 * writes give only with the filesystem's journal, seconds later: a
 * power cut in between would leave merged bytes under the old time,
 * and those overlays would be served over them.
 */
static int
touch_base (const struct mloop_backing *base, char *err, size_t errlen)
{
  struct stat st;
  int r;

  if (fstat (base->fd, &st) == -1)
    r = -errno;
  else if (S_ISREG (st.st_mode) && futimens (base->fd, NULL) == -1)
    r = -errno;
  else
    r = fsync (base->fd) == -1 ? -errno : 0;
  if (r < 0)
    snprintf (err, errlen, "cannot give %s a new modification time before "
              "writing into it: %s", base->path, strerror (-r));
  return r;
}

/* Copies the marked clusters, a run of at most MERGE_CHUNK at a time:
 * what the data area holds there (holes, trimmed or zeroed clusters,
 * read as zeroes) goes to the same place in BASE.
 */
static int
copy_marked (const struct mloop_overlay *ov, const struct mloop_backing *base,
             char *buf, char *err, size_t errlen)
{
  bool touched = false;
  uint64_t pos = 0;
  int r;

  while (pos < ov->size) {
    uint64_t end;

    if (!in_overlay (ov, pos)) {
      pos += MLOOP_OVERLAY_CLUSTER;
      continue;
    }
    end = pos;
    while (end < ov->size && end - pos < MERGE_CHUNK && in_overlay (ov, end))
      end += cluster_bytes (ov, end);
    r = mloop_pread_or_zero (ov->fd, buf, end - pos, ov->data_offset + pos);
    if (r < 0) {
      snprintf (err, errlen, "cannot read overlay %s: %s", ov->path,
                strerror (-r));
      return r;
    }
    if (!touched && (r = touch_base (base, err, errlen)) < 0)
      return r;
    touched = true;
    r = mloop_pwrite_all (base->fd, buf, end - pos, pos, 0);
    if (r < 0) {
      snprintf (err, errlen, "cannot write %s: %s", base->path,
                strerror (-r));
      return r;
    }
    pos = end;
  }
  return 0;
}

/* Whether the overlay's owner may write BASE: refused in ERR if not.
 * The overlay's header, which names the base, its device, inode and
 * fingerprint and marks a merge stopped half-way, is its owner's to
 * write: it proves nothing a file's stat does not tell anyone.  So the
 * merge writes only where that owner could have written, whoever runs
 * it.
 */
static int
check_owner_may_write (const struct mloop_overlay *ov,
                       const struct mloop_backing *base, char *err,
                       size_t errlen)
{
  char user[256] = "", why[256];
  struct stat st;
  int r;

  /* Whoever may write the file may have written its header: with write
   * for its group or others, its owner is not the only one who chose
   * the base, and who did cannot be told.
   */
  if (fstat (ov->fd, &st) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", ov->path, strerror (-r));
    return r;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    snprintf (err, errlen, "overlay %s may be written by others than its "
              "owner (mode %04o), so any of them may have named its base: "
              "not committed (chmod go-w it if that is not so)", ov->path,
              (unsigned) (st.st_mode & 07777));
    return -EACCES;
  }
  r = mloop_owner_may_write (ov->fd, base->fd, base->path, user,
                             sizeof user, why, sizeof why);

  if (r == 1)
    return 0;
  if (r == 0) {
    snprintf (err, errlen, "overlay %s belongs to %s, who may not write %s: "
              "it is not committed there", ov->path, user, base->path);
    return -EACCES;
  }
  snprintf (err, errlen, "overlay %s: whether its owner may write %s: %s",
            ov->path, base->path, why);
  return r;
}

/* Whether BASE_PATH leads to the file open in BASE through no symbolic
 * link: refused in ERR if not.  The path is canonical when the caller
 * chose it (realpath, or the overlay's record of one); a link on it now
 * was put there since, by whoever owns a directory on it, perhaps a
 * user whose image root serves, and would have root's commit write a
 * file of that user's choosing.  Looked at once the base is open, so a
 * link swapped out again in between is seen: the path, followed
 * without links, must name the very file written.
 */
static int
check_no_link (const char *base_path, const struct mloop_backing *base,
               char *err, size_t errlen)
{
  struct open_how how = {
    .flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_NO_SYMLINKS,
  };
  struct stat named, held;
  int fd, r;

  fd = (int) syscall (SYS_openat2, AT_FDCWD, base_path, &how, sizeof how);
  if (fd == -1 && errno == ENOSYS) {
    /* A kernel before 5.6 or a seccomp filter: the path as realpath
     * finds it, without the guarantee against a swap in between.
     */
    char *abs = realpath (base_path, NULL);
    bool canonical = abs && base_path[0] == '/' &&
      strcmp (abs, base_path) == 0;

    free (abs);
    fd = canonical ? open (base_path, O_PATH | O_CLOEXEC) : -1;
    if (!canonical)
      errno = ELOOP;
  }
  if (fd == -1 && errno == ELOOP) {
    snprintf (err, errlen, "%s leads through a symbolic link: not "
              "committed (name the base with --base if it is there)",
              base_path);
    return -ELOOP;
  }
  if (fd == -1) {
    r = -errno;
    snprintf (err, errlen, "%s: %s", base_path, strerror (-r));
    return r;
  }
  r = fstat (fd, &named) == 0 && fstat (base->fd, &held) == 0 ? 0 : -errno;
  close (fd);
  if (r < 0) {
    snprintf (err, errlen, "%s: %s", base_path, strerror (-r));
    return r;
  }
  if (named.st_dev != held.st_dev || named.st_ino != held.st_ino) {
    snprintf (err, errlen, "%s was replaced while being opened: not "
              "committed", base_path);
    return -ESTALE;
  }
  return 0;
}

/* Refuses, in ERR, the overlay OV when it has another name (a hard
 * link: a copy of its directory by `cp -al`, rsnapshot): the commit
 * removes one name, and the file would stay under the other, merged,
 * for a device to be attached with.  MERGED: the merge is done, and a
 * name was given during it.
 */
static int
refuse_other_names (const struct mloop_overlay *ov, bool merged, char *err,
                    size_t errlen)
{
  struct stat st;

  if (fstat (ov->fd, &st) == -1) {
    int r = -errno;

    snprintf (err, errlen, "overlay %s: %s", ov->path, strerror (-r));
    return r;
  }
  if (st.st_nlink <= 1)
    return 0;
  if (merged)
    snprintf (err, errlen, "committed, but overlay %s was given other names "
              "(hard links, %ju names in all) during the commit: not "
              "removed; it can go: remove every name with rm (discard "
              "refuses an overlay of several names)", ov->path,
              (uintmax_t) st.st_nlink);
  else
    snprintf (err, errlen, "overlay %s has %ju names (hard links): a "
              "commit removes only this one, and the overlay would stay "
              "under the others; remove them first", ov->path,
              (uintmax_t) st.st_nlink);
  return -EMLINK;
}

/* Refuses, in ERR, NAME in the directory DIR (PATH) when it is a
 * symbolic link.
 */
static int
refuse_link_at (int dir, const char *name, const char *path, char *err,
                size_t errlen)
{
  struct stat st;

  if (fstatat (dir, name, &st, AT_SYMLINK_NOFOLLOW) == -1 ||
      !S_ISLNK (st.st_mode))
    return 0;
  snprintf (err, errlen, "%s is a symbolic link: name the overlay file "
            "itself, which is removed once committed", path);
  return -ELOOP;
}

/* Refuses, in ERR, the overlay OV opened by PATH when it is not the
 * file NAME in the directory DIR names, the entry a commit unlinks: a
 * rename over the name since it was opened.  (That OV is the file the
 * caller checked, mloop_overlay_open_existing saw to.)
 */
static int
refuse_unnamed_opened (const struct mloop_overlay *ov, const char *path,
                       int dir, const char *name, char *err, size_t errlen)
{
  if (mloop_names_file_at (dir, name, ov->fd))
    return 0;
  snprintf (err, errlen, "%s was replaced while being opened (it leads to "
            "another file, or through a symbolic link): not committed",
            path);
  return -ESTALE;
}

/* Claims BASE, when it is a block device, as the kernel's own holders
 * do (an open with O_EXCL): a mount of it, read-only as well, a swap
 * area, device-mapper, LVM or md over it each hold such a claim, which
 * the image lock does not see (only mloop's servers and QEMU take that
 * one), and the merge would write under them: a mounted filesystem's
 * cached metadata would no longer match its disk.  Held until the merge
 * ends, it keeps a mount off the device meanwhile.  *CLAIM: the
 * descriptor that holds it, or -1 for a regular file.
 */
static int
claim_device (const struct mloop_backing *base, const char *base_path,
              int *claim, char *err, size_t errlen)
{
  int r;

  *claim = -1;
  if (!base->is_block_device)
    return 0;
  *claim = mloop_open_looked_up (base->fd, AT_FDCWD, base_path,
                                 O_RDONLY | O_EXCL | O_CLOEXEC);
  if (*claim >= 0)
    return 0;
  r = -errno;
  if (r == -EBUSY)
    snprintf (err, errlen, "%s, the overlay's base, is held by the system "
              "(mounted, a swap area, or under device-mapper, LVM or md): "
              "not committed (unmount or release it first)", base_path);
  else
    snprintf (err, errlen, "%s: %s", base_path, strerror (-r));
  return r;
}

/* Reads the sysfs attribute PATH into BUF, of LEN bytes: whether it
 * held anything.
 */
static bool
read_sysfs (const char *path, char *buf, size_t len)
{
  FILE *f = fopen (path, "re");
  size_t n;

  if (f == NULL)
    return false;
  n = fread (buf, 1, len - 1, f);
  fclose (f);
  buf[n] = '\0';
  return n > 0;
}

/* The same, for NAME in the directory open at DIR. */
static bool
read_sysfs_at (int dir, const char *name, char *buf, size_t len)
{
  int fd = openat (dir, name, O_RDONLY | O_CLOEXEC);
  ssize_t n;

  if (fd == -1)
    return false;
  n = read (fd, buf, len - 1);
  close (fd);
  buf[n < 0 ? 0 : n] = '\0';
  return n > 0;
}

/* The device number a sysfs "dev" attribute PATH holds ("MAJ:MIN"). */
static bool
sysfs_dev (const char *path, dev_t *dev)
{
  unsigned maj, min;
  char buf[64];

  if (!read_sysfs (path, buf, sizeof buf) ||
      sscanf (buf, "%u:%u", &maj, &min) != 2)
    return false;
  *dev = makedev (maj, min);
  return true;
}

/* The number a sysfs attribute PATH holds. */
static bool
sysfs_u64 (const char *path, uint64_t *v)
{
  char buf[32], *end;

  if (!read_sysfs (path, buf, sizeof buf))
    return false;
  errno = 0;
  *v = strtoull (buf, &end, 10);
  return errno == 0 && end != buf;
}

/* The base a loop device must not hold: its file, and for a block
 * device the blocks that share its bytes.
 */
struct held_base {
  struct stat st;
  /* A partition: bytes [START, END) of the disk DISK. */
  bool partition;
  dev_t disk;
  uint64_t start, end;
};

/* The bytes of its disk the partition whose sysfs directory is DIR
 * covers, [*FROM, *TO): its start and size are in 512-byte sectors
 * whatever the disk's own; unknown, the whole disk counts.
 */
static void
partition_place (const char *dir, uint64_t *from, uint64_t *to)
{
  char path[PATH_MAX];
  uint64_t start, size;

  *from = 0;
  *to = UINT64_MAX;
  snprintf (path, sizeof path, "%s/start", dir);
  if (sysfs_u64 (path, &start) && start < UINT64_MAX / 512) {
    snprintf (path, sizeof path, "%s/size", dir);
    if (sysfs_u64 (path, &size) && size < UINT64_MAX / 512 - start) {
      *from = start * 512;
      *to = (start + size) * 512;
    }
  }
}

/* Fills in B for the base open in FD: false if it cannot be told. */
static bool
held_base_of (int fd, struct held_base *b)
{
  char dir[64], path[96];

  memset (b, 0, sizeof *b);
  if (fstat (fd, &b->st) == -1)
    return false;
  if (!S_ISBLK (b->st.st_mode))
    return true;
  snprintf (dir, sizeof dir, "/sys/dev/block/%u:%u", major (b->st.st_rdev),
            minor (b->st.st_rdev));
  snprintf (path, sizeof path, "%s/partition", dir);
  if (access (path, F_OK) == -1)
    return true;
  b->partition = true;
  snprintf (path, sizeof path, "%s/../dev", dir);
  if (!sysfs_dev (path, &b->disk))
    b->partition = false;
  partition_place (dir, &b->start, &b->end);
  return true;
}

/* Whether a loop device over the block device RDEV, from byte OFFSET
 * of it on, SIZELIMIT bytes of it (0: to its end), reaches the bytes of
 * the block device B: B itself, a partition of B (`mount -o loop,ro
 * /dev/sdb1` while the base is /dev/sdb), or the disk of B, a
 * partition, where the window covers some of B (`losetup -o` the
 * partition's start on /dev/sdb while the base is /dev/sdb1).
 */
static bool
reaches_block (const struct held_base *b, dev_t rdev, uint64_t offset,
               uint64_t sizelimit)
{
  char path[96];
  dev_t disk;

  if (rdev == b->st.st_rdev)
    return true;
  snprintf (path, sizeof path, "/sys/dev/block/%u:%u/partition",
            major (rdev), minor (rdev));
  if (access (path, F_OK) == 0) {
    snprintf (path, sizeof path, "/sys/dev/block/%u:%u/../dev",
              major (rdev), minor (rdev));
    if (sysfs_dev (path, &disk) && disk == b->st.st_rdev)
      return true;
  }
  return b->partition && rdev == b->disk && offset < b->end &&
    (sizelimit == 0 || offset >= b->start || sizelimit > b->start - offset);
}

/* Refuses, in ERR, a partition BASE that shares bytes with another
 * partition of its disk.  Partition tables may nest them (a hybrid
 * ISO's EFI image inside its whole-ISO partition, a BSD disklabel's
 * partitions inside their MBR slice), and the kernel keeps each
 * partition's claim to itself: a mount of the inner one leaves the
 * outer one free to claim (claim_device), is no loop device and no
 * process's descriptor, and the merge would write under it.  Such a
 * layout is refused whatever holds it: a partition whose place sysfs
 * does not tell counts as sharing.
 */
static int
refuse_nested_partitions (const struct mloop_backing *base,
                          const char *base_path, char *err, size_t errlen)
{
  char dir[64], path[sizeof dir + NAME_MAX + 16];
  struct held_base held;
  struct dirent *e;
  DIR *disk;
  int r = 0;

  if (!base->is_block_device)
    return 0;
  if (!held_base_of (base->fd, &held)) {
    r = -errno;
    snprintf (err, errlen, "%s, the overlay's base: %s", base_path,
              strerror (-r));
    return r;
  }
  if (!held.partition)
    return 0;
  snprintf (dir, sizeof dir, "/sys/dev/block/%u:%u", major (held.disk),
            minor (held.disk));
  if ((disk = opendir (dir)) == NULL) {
    r = -errno;
    snprintf (err, errlen, "cannot look for partitions sharing blocks "
              "with %s, the overlay's base (%s: %s): not committed",
              base_path, dir, strerror (-r));
    return r;
  }
  while (r == 0 && (e = readdir (disk)) != NULL) {
    uint64_t from, to;
    dev_t dev;

    snprintf (path, sizeof path, "%s/%s/partition", dir, e->d_name);
    if (e->d_name[0] == '.' || access (path, F_OK) == -1)
      continue;
    snprintf (path, sizeof path, "%s/%s/dev", dir, e->d_name);
    if (sysfs_dev (path, &dev) && dev == held.st.st_rdev)
      continue;
    snprintf (path, sizeof path, "%s/%s", dir, e->d_name);
    partition_place (path, &from, &to);
    if (from < to && from < held.end && held.start < to) {
      snprintf (err, errlen, "%s, the overlay's base, shares blocks with "
                "/dev/%s, another partition of its disk (nested "
                "partitions), whose holders a commit cannot all see: not "
                "committed", base_path, e->d_name);
      r = -EBUSY;
    }
  }
  closedir (disk);
  return r;
}

/* Whether FD is open on the block device /sys/block/NAME: its device
 * number the one sysfs gives.
 */
static bool
node_is (int fd, const char *name)
{
  char path[sizeof "/sys/block//dev" + NAME_MAX];
  struct stat st;
  dev_t dev;

  snprintf (path, sizeof path, "/sys/block/%s/dev", name);
  return fstat (fd, &st) == 0 && S_ISBLK (st.st_mode) &&
    sysfs_dev (path, &dev) && st.st_rdev == dev;
}

/* What a loop device is to the base (loop_holds). */
enum loop_hold {
  LOOP_ELSEWHERE,
  LOOP_HOLDS,
  /* It could not be asked, and its path says nothing here. */
  LOOP_UNKNOWN,
};

/* Whether the loop device NAME (bound: its sysfs BACKING path read)
 * is attached to the file of B, or for a block device to any block
 * sharing its bytes (reaches_block).  Asked of the device itself
 * (LOOP_GET_STATUS64: the backing file's device and inode, or a backing
 * block device's number, and the window), which no path misleads: the
 * sysfs path is the one its attacher gave, from their mount namespace,
 * and "(deleted)" once that name is gone while the file lives on under
 * another.  The path is compared only when the device cannot be asked
 * (a caller outside the disk group, no node here or one of another
 * device), with the window sysfs shows; a path that ends so, or leads
 * nowhere here, may be the base under a name this caller cannot see:
 * LOOP_UNKNOWN, and *WHY says why the device could not be asked.
 */
static enum loop_hold
loop_holds (const char *name, const char *backing, const struct held_base *b,
            int *why)
{
  static const char deleted[] = " (deleted)";
  char node[sizeof "/dev/" + NAME_MAX], path[PATH_MAX];
  const size_t len = strlen (backing);
  uint64_t offset = 0, sizelimit = 0;
  struct loop_info64 info;
  struct stat named;
  bool holds;
  int fd;

  snprintf (node, sizeof node, "/dev/%s", name);
  /* Zeroed: valgrind does not know what this ioctl fills in. */
  memset (&info, 0, sizeof info);
  fd = open (node, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  *why = fd == -1 ? errno : 0;
  /* Only the device sysfs names: /dev may be another's (a container's
   * own, `docker --device /dev/loop3:/dev/loop0`), and a node there of
   * another loop device would answer for that one.
   */
  if (fd >= 0 && !node_is (fd, name)) {
    close (fd);
    fd = -1;
    *why = ENODEV;
  }
  if (fd >= 0) {
    int r = ioctl (fd, LOOP_GET_STATUS64, &info);

    *why = r == -1 ? errno : 0;
    close (fd);
    if (r == 0) {
      holds = S_ISBLK (b->st.st_mode)
        ? reaches_block (b, (dev_t) info.lo_rdevice, info.lo_offset,
                         info.lo_sizelimit)
        : info.lo_device == b->st.st_dev && info.lo_inode == b->st.st_ino;
      return holds ? LOOP_HOLDS : LOOP_ELSEWHERE;
    }
    /* Detached since its sysfs path was read. */
    if (*why == ENXIO)
      return LOOP_ELSEWHERE;
  }
  if ((len >= sizeof deleted - 1 &&
       strcmp (backing + len - (sizeof deleted - 1), deleted) == 0) ||
      stat (backing, &named) == -1)
    return LOOP_UNKNOWN;
  if (!S_ISBLK (b->st.st_mode))
    holds = S_ISREG (named.st_mode) && named.st_dev == b->st.st_dev &&
      named.st_ino == b->st.st_ino;
  else if (!S_ISBLK (named.st_mode))
    holds = false;
  else {
    snprintf (path, sizeof path, "/sys/block/%s/loop/offset", name);
    (void) sysfs_u64 (path, &offset);
    snprintf (path, sizeof path, "/sys/block/%s/loop/sizelimit", name);
    (void) sysfs_u64 (path, &sizelimit);
    holds = reaches_block (b, named.st_rdev, offset, sizelimit);
  }
  return holds ? LOOP_HOLDS : LOOP_ELSEWHERE;
}

/* Refuses, in ERR, a BASE that a loop device is attached to (a loop
 * mount of the image, read-only as well, to look inside it; a loop
 * device over a block device's disk to mount a partition of it, or
 * over a partition of it): the loop driver holds its file or device
 * open but takes no lock or claim, and the merge would write under the
 * filesystem mounted from it.  One attached after this look is not
 * seen: losetup heeds no lock.  Nor is one this caller cannot ask
 * whose path leads here to another file (another mount namespace's);
 * one whose path leads nowhere may be the base, and is refused.
 */
static int
refuse_loop_backed (const struct mloop_backing *base, const char *base_path,
                    char *err, size_t errlen)
{
  struct held_base held;
  struct dirent *e;
  DIR *block;
  int r = 0;

  /* Not looked for is not absent: a commit that cannot look (no sysfs
   * in a container, say) writes under no loop device it cannot see.
   */
  if (!held_base_of (base->fd, &held)) {
    r = -errno;
    snprintf (err, errlen, "%s, the overlay's base: %s", base_path,
              strerror (-r));
    return r;
  }
  if ((block = opendir ("/sys/block")) == NULL) {
    r = -errno;
    snprintf (err, errlen, "cannot look for loop devices attached to %s, "
              "the overlay's base (/sys/block: %s): not committed",
              base_path, strerror (-r));
    return r;
  }
  while (r == 0 && (e = readdir (block)) != NULL) {
    char file[PATH_MAX], backing[PATH_MAX + 1];
    enum loop_hold hold;
    size_t len;
    FILE *f;
    int why;

    if (strncmp (e->d_name, "loop", 4) != 0)
      continue;
    snprintf (file, sizeof file, "/sys/block/%s/loop/backing_file",
              e->d_name);
    if ((f = fopen (file, "re")) == NULL)
      continue;
    len = fread (backing, 1, sizeof backing - 1, f);
    fclose (f);
    backing[len] = '\0';
    if (len > 0 && backing[len - 1] == '\n')
      backing[len - 1] = '\0';
    hold = loop_holds (e->d_name, backing, &held, &why);
    if (hold == LOOP_HOLDS) {
      snprintf (err, errlen, "%s, the overlay's base%s, is attached to "
                "the loop device /dev/%s (a loop mount of it?): not "
                "committed (unmount it, or losetup -d it, first)", base_path,
                S_ISBLK (held.st.st_mode) ? " or a partition or disk "
                "sharing its blocks" : "", e->d_name);
      r = -EBUSY;
    }
    else if (hold == LOOP_UNKNOWN) {
      snprintf (err, errlen, "the loop device /dev/%s, which cannot be "
                "asked here (%s), is attached to %s, which does not lead "
                "to a file here: it may be %s, the overlay's base; not "
                "committed (detach it, or run the commit as root)",
                e->d_name, strerror (why), backing, base_path);
      r = -EBUSY;
    }
  }
  closedir (block);
  return r;
}

/* Whether the descriptor table listed in the directory open at FD
 * (/proc/PID/task/TID/fd) holds a block device sharing bytes with B:
 * then the node it opened into NODE.  Asked of each descriptor's file
 * itself (its type and device number), which no node's name or mount
 * namespace hides; statx'd without a sync, so that a hung network or
 * FUSE mount holding some other process's file does not hang the
 * commit.  FD is closed.
 */
static bool
table_holds (int fd, const struct held_base *b, char *node, size_t nodelen)
{
  struct dirent *e;
  bool found = false;
  DIR *fds = fdopendir (fd);

  if (fds == NULL) {
    close (fd);
    return false;
  }
  while (!found && (e = readdir (fds)) != NULL) {
    struct statx stx;
    ssize_t n;

    if (e->d_name[0] == '.' ||
        statx (dirfd (fds), e->d_name, AT_STATX_DONT_SYNC, STATX_TYPE,
               &stx) == -1 || !S_ISBLK (stx.stx_mode) ||
        !reaches_block (b, makedev (stx.stx_rdev_major,
                                    stx.stx_rdev_minor), 0, 0))
      continue;
    found = true;
    n = readlinkat (dirfd (fds), e->d_name, node, nodelen - 1);
    node[n < 0 ? 0 : n] = '\0';
  }
  closedir (fds);
  return found;
}

/* How many descriptor tables of one process are told apart before the
 * rest are each read whole.
 */
#define TABLES_KNOWN 16

/* Whether the process whose /proc directory is open at PROC holds a
 * block device sharing bytes with B in any of its descriptor tables
 * (table_holds).  /proc/PID/fd is only its leader's: a thread with a
 * table of its own (clone without CLONE_FILES, unshare (CLONE_FILES))
 * shows its descriptors in /proc/PID/task/TID/fd alone, and once the
 * leader has exited (pthread_exit from main) /proc/PID/fd lists
 * nothing while the other threads hold on.  So every thread's table is
 * read, once each: threads that share one (kcmp says so) are read
 * once; where kcmp cannot tell, each thread's is read.
 */
static bool
process_holds (int proc, const struct held_base *b, char *node,
               size_t nodelen)
{
  pid_t tables[TABLES_KNOWN];
  size_t ntables = 0;
  struct dirent *t;
  bool found = false;
  int fd = openat (proc, "task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *tasks;

  if (fd == -1)
    return false;
  if ((tasks = fdopendir (fd)) == NULL) {
    close (fd);
    return false;
  }
  while (!found && (t = readdir (tasks)) != NULL) {
    char dir[64], *end;
    long tid = strtol (t->d_name, &end, 10);
    bool seen = false;

    if (*end != '\0' || tid <= 0)
      continue;
    for (size_t i = 0; i < ntables && !seen; i++)
      seen = syscall (SYS_kcmp, (pid_t) tables[i], (pid_t) tid, KCMP_FILES,
                      0UL, 0UL) == 0;
    if (seen)
      continue;
    if (ntables < TABLES_KNOWN)
      tables[ntables++] = (pid_t) tid;
    snprintf (dir, sizeof dir, "%ld/fd", tid);
    fd = openat (dirfd (tasks), dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd != -1)
      found = table_holds (fd, b, node, nodelen);
  }
  closedir (tasks);
  return found;
}

/* The first process other than this one found holding a descriptor
 * open on a block device that shares bytes with B (reaches_block: the
 * base's disk under any node, a partition of it, or its disk), in any
 * of its threads' descriptor tables (process_holds): its pid, its
 * command in COMM and the node it opened in NODE.  Only the processes
 * whose descriptors this caller may see are looked at (all of them for
 * root; a user's own otherwise).  0: none; -1 with errno: /proc cannot
 * be read.
 */
static pid_t
block_opener (const struct held_base *b, char *comm, size_t commlen,
              char *node, size_t nodelen)
{
  const pid_t self = getpid ();
  struct dirent *p;
  pid_t found = 0;
  DIR *proc;

  if ((proc = opendir ("/proc")) == NULL)
    return -1;
  while (found == 0 && (p = readdir (proc)) != NULL) {
    char *end;
    long pid = strtol (p->d_name, &end, 10);
    int fd;

    if (*end != '\0' || pid <= 0 || pid == self)
      continue;
    /* The process's directory, opened once: its pid, were it to exit,
     * could be another process's by the time its threads are read.
     */
    fd = openat (dirfd (proc), p->d_name,
                 O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd == -1)
      continue;
    if (process_holds (fd, b, node, nodelen)) {
      found = (pid_t) pid;
      if (!read_sysfs_at (fd, "comm", comm, commlen))
        snprintf (comm, commlen, "?");
      comm[strcspn (comm, "\n")] = '\0';
    }
    close (fd);
  }
  closedir (proc);
  return found;
}

/* Refuses, in ERR, a block-device BASE that another process holds open
 * under any node of its disk, or of a partition or disk sharing its
 * bytes.  The image lock is taken on a node's inode, not on the disk:
 * a server holding the disk through one node (a container's, a
 * `dmsetup mknodes` one, /dev/mapper beside /dev/dm-N) holds nothing
 * against a commit through another.  Any descriptor is refused, not
 * only a locked one: a reader has the disk's bytes change under it.
 * One that goes within half a second (udev probing the device after a
 * write) is let be.  Only the processes this caller may see are looked
 * at (block_opener).
 */
static int
refuse_block_openers (const struct mloop_backing *base,
                      const char *base_path, char *err, size_t errlen)
{
  char comm[64], node[PATH_MAX];
  struct held_base held;
  pid_t pid = 0;

  if (!base->is_block_device)
    return 0;
  if (!held_base_of (base->fd, &held)) {
    const int r = -errno;

    snprintf (err, errlen, "%s, the overlay's base: %s", base_path,
              strerror (-r));
    return r;
  }
  for (int i = 0; i < 5; i++) {
    if (i > 0)
      usleep (100 * 1000);
    if ((pid = block_opener (&held, comm, sizeof comm, node,
                             sizeof node)) == 0)
      return 0;
    if (pid == -1) {
      const int r = -errno;

      snprintf (err, errlen, "cannot look for processes holding %s, the "
                "overlay's base (/proc: %s): not committed", base_path,
                strerror (-r));
      return r;
    }
  }
  snprintf (err, errlen, "%s, the overlay's base, is open in process %ld "
            "(%s) as %s: not committed (stop it first)", base_path,
            (long) pid, comm, node);
  return -EBUSY;
}

int
mloop_overlay_merge (const char *path, const char *base_path, bool adopt,
                     bool remove, char *err, size_t errlen)
{
  return mloop_overlay_merge_checked (path, NULL, base_path, adopt, remove,
                                      err, errlen);
}

int
mloop_overlay_merge_checked (const char *path, const struct stat *checked,
                             const char *base_path, bool adopt, bool remove,
                             char *err, size_t errlen)
{
  const struct mloop_window whole = { 0, 0 };
  struct mloop_backing base;
  struct mloop_overlay ov;
  char *buf, *name = NULL, why[PATH_MAX + 128];
  int dir = -1, claim = -1, r;

  /* Said before the base is opened; the open below never makes one. */
  if (access (path, F_OK) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
    return r;
  }
  /* Removed from the directory that held it, by its entry there: a
   * directory on the path, perhaps another user's, may be swapped for
   * a symlink meanwhile, and the name unlinked through it would be
   * another directory's file.
   */
  if (remove && (dir = mloop_open_parent (path, &name)) == -1) {
    r = -errno;
    snprintf (err, errlen, "the directory of %s: %s", path, strerror (-r));
    return r;
  }
  /* The entry unlinked is the one named: a symbolic link to the overlay
   * would go, and the overlay, merged, stay behind.
   */
  if (remove && (r = refuse_link_at (dir, name, path, err, errlen)) < 0)
    goto out;
  r = mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, true, &whole,
                          err, errlen);
  if (r < 0)
    goto out;
  /* An image refused for writing is opened for reading (backing.h), as
   * a server wants: here the merge would mark the overlay half-merged
   * and only then fail its first write, leaving a mark that discard
   * heeds for good.
   */
  if (!base.writable) {
    snprintf (err, errlen, "cannot write %s, the overlay's base (its "
              "permissions, a read-only mount or an immutable file): not "
              "committed", base_path);
    r = -EACCES;
    goto out_base;
  }
  if ((r = check_no_link (base_path, &base, err, errlen)) < 0)
    goto out_base;
  /* Every server reading or writing the base holds it shared, whatever
   * name it was given (file_store.c), and every QEMU process with it
   * open holds QEMU's lock bytes: none may while it changes here.
   * Taken before the overlay's check of the base, so that the base
   * written is the one checked: a writer that let go of it in between
   * would have changed it unseen.
   */
  if ((r = mloop_lock_image (base.fd, true)) < 0) {
    snprintf (err, errlen, "%s, the overlay's base, is in use by a server "
              "or device, or open in QEMU: stop it first", base_path);
    goto out_base;
  }
  if ((r = claim_device (&base, base_path, &claim, err, errlen)) < 0 ||
      (r = refuse_nested_partitions (&base, base_path, err, errlen)) < 0 ||
      (r = refuse_loop_backed (&base, base_path, err, errlen)) < 0 ||
      (r = refuse_block_openers (&base, base_path, err, errlen)) < 0)
    goto out_base;
  r = mloop_overlay_open_existing (&ov, path, checked, &base, false,
                                   adopt ? MLOOP_OVERLAY_MERGE_ANY_BASE
                                   : MLOOP_OVERLAY_MERGE_BASE, err, errlen);
  if (r < 0)
    goto out_base;
  /* Opened by the path, which may lead elsewhere by now: only the one
   * the entry to be unlinked names.
   */
  r = remove ? refuse_unnamed_opened (&ov, path, dir, name, err, errlen) : 0;
  if (r == 0 && remove)
    r = refuse_other_names (&ov, false, err, errlen);
  if (r == 0)
    r = check_owner_may_write (&ov, &base, err, errlen);
  /* Pages of it may be lost (a sync failed, under a server or in this
   * open): merged, they would reach the base as stale bytes, and the
   * overlay and its mark go.  Its owner checks it first, and clears.
   */
  if (r == 0 && mloop_overlay_sync_failed (&ov)) {
    snprintf (err, errlen, "a sync of overlay %s failed, so writes its "
              "server answered may be lost: check the data on it, then "
              "mloop overlay clear %s (not committed)", path, path);
    r = -EIO;
  }
  if (r < 0) {
    mloop_overlay_close (&ov);
    goto out_base;
  }
  buf = malloc (MERGE_CHUNK);
  if (buf == NULL) {
    r = -ENOMEM;
    snprintf (err, errlen, "overlay %s: out of memory", path);
  }
  else if ((r = mloop_overlay_note_merging (&ov, &base, err, errlen)) < 0)
    ;
  else
    r = copy_marked (&ov, &base, buf, err, errlen);
  /* fsync, not fdatasync: the base's new modification time is how
   * every other overlay made over it tells it was written since, and
   * fdatasync may leave it to the filesystem's journal, seconds later.
   * A power cut that kept the bytes but not the time would have them
   * served over the merged bytes.
   */
  if (r == 0 && fsync (base.fd) == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot sync %s: %s", base_path, strerror (-r));
  }
  /* Done, durably: the mark goes now, before any removal.  An overlay
   * left behind (its name replaced or given others, the unlink refused,
   * a power cut before its directory is synced) is then one whose base
   * was written since (the merge gave it a new time, or new ends),
   * which discard removes and a commit or a device refuses; marked,
   * discard would keep it as half-merged and a commit write its
   * clusters again over whatever the base was given since.
   */
  if (r == 0 && (r = mloop_overlay_note_merged (&ov, why, sizeof why)) < 0)
    snprintf (err, errlen, "committed into %s, but %s; it stays, marked "
              "as committed half-way: remove it with rm (discard refuses "
              "it, a commit would write it over the base again)", base_path,
              why);
  /* Before the overlay's lock goes (with its descriptors, closed
   * below): a server that took the lock after it would serve a file
   * about to be unlinked.
   */
  /* Only the overlay merged: its name may have been given to another
   * file during the merge (a rename over it), which is not removed.
   */
  if (r == 0 && remove && !mloop_names_file_at (dir, name, ov.fd)) {
    r = -ESTALE;
    snprintf (err, errlen, "committed, but %s was replaced during the "
              "merge: the file there now is not removed (the overlay, "
              "renamed, can be discarded)", path);
  }
  /* Names were counted before the merge, which may take minutes: one
   * given meanwhile (a snapshot of the directory by `cp -al`) would
   * keep the overlay, merged and marked.  Counted again here, not once
   * the name is unlinked: NFS keeps an open file it unlinks under a
   * name of its own (.nfsXXXX) until it is closed.
   */
  if (r == 0 && remove)
    r = refuse_other_names (&ov, true, err, errlen);
  if (r == 0 && remove && unlinkat (dir, name, 0) == -1) {
    r = -errno;
    snprintf (err, errlen, "committed, but %s stays: %s (it can be "
              "discarded: mloop overlay discard %s)", path, strerror (-r),
              path);
  }
  /* Durably, as discard does: undone by a power cut, the removal would
   * bring the overlay back, for a device attached with its name later
   * (refused when the merge changed the base's time or ends, served
   * over whatever the base was given since when not).
   */
  if (r == 0 && remove && fsync (dir) == -1) {
    r = -errno;
    snprintf (err, errlen, "committed and removed %s, but its directory "
              "could not be synced: %s (should a crash bring it back, "
              "discard it)", path, strerror (-r));
  }
  free (buf);
  mloop_overlay_close (&ov);
 out_base:
  if (claim != -1)
    close (claim);
  mloop_backing_close (&base);
 out:
  if (dir != -1)
    close (dir);
  free (name);
  return r;
}

int
mloop_overlay_adopt (const char *path, const char *base_path, char *err,
                     size_t errlen)
{
  return mloop_overlay_adopt_checked (path, NULL, base_path, err, errlen);
}

int
mloop_overlay_adopt_checked (const char *path, const struct stat *checked,
                             const char *base_path, char *err,
                             size_t errlen)
{
  const struct mloop_window whole = { 0, 0 };
  struct mloop_backing base;
  struct mloop_overlay ov;
  int r;

  /* Said before the base is opened; the open below never makes one. */
  if (access (path, F_OK) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
    return r;
  }
  r = mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, &whole,
                          err, errlen);
  if (r < 0)
    return r;
  /* Read under the base's shared lock, as a server reads it: a commit
   * writing it meanwhile (another overlay's, holding it exclusively)
   * would have its fingerprint and times recorded half-way, and its
   * last writes, within one timestamp tick of that, would go unseen.
   */
  if ((r = mloop_lock_image (base.fd, false)) < 0)
    snprintf (err, errlen, "%s is locked by an overlay being merged into "
              "it (mloop overlay commit): %s: not adopted", base_path,
              strerror (-r));
  else {
    r = mloop_overlay_open_existing (&ov, path, checked, &base, false,
                                     MLOOP_OVERLAY_ADOPT_BASE, err, errlen);
    if (r == 0)
      mloop_overlay_close (&ov);
  }
  mloop_backing_close (&base);
  return r;
}
