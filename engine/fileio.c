/* mloop — whole-buffer positional IO on a file.  See fileio.h. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fileio.h"

int
mloop_pread_or_zero (int fd, void *buf, size_t count, uint64_t pos)
{
  char *p = buf;

  while (count > 0) {
    ssize_t r = pread (fd, p, count, (off_t) pos);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -errno;
    if (r == 0) {
      memset (p, 0, count);
      return 0;
    }
    p += r;
    count -= (size_t) r;
    pos += (uint64_t) r;
  }
  return 0;
}

int
mloop_pwrite_all (int fd, const void *buf, size_t count, uint64_t pos,
            int rw_flags)
{
  const char *p = buf;

  while (count > 0) {
    struct iovec iov = { (void *) p, count };
    ssize_t r = pwritev2 (fd, &iov, 1, (off_t) pos, rw_flags);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      return -errno;
    if (r == 0)
      return -EIO;
    p += r;
    count -= (size_t) r;
    pos += (uint64_t) r;
  }
  return 0;
}


int
mloop_open_parent (const char *path, char **name)
{
  char *dir_copy = strdup (path), *name_copy = strdup (path);
  int fd = -1, saved;

  *name = NULL;
  if (dir_copy == NULL || name_copy == NULL) {
    saved = ENOMEM;
    goto out;
  }
  *name = strdup (basename (name_copy));
  if (*name == NULL) {
    saved = ENOMEM;
    goto out;
  }
  fd = open (dirname (dir_copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  saved = errno;
  if (fd == -1) {
    free (*name);
    *name = NULL;
  }
 out:
  free (dir_copy);
  free (name_copy);
  errno = saved;
  return fd;
}

bool
mloop_names_file_at (int dirfd, const char *name, int fd)
{
  struct stat named, held;

  return fstatat (dirfd, name, &named, AT_SYMLINK_NOFOLLOW) == 0 &&
    fstat (fd, &held) == 0 &&
    named.st_dev == held.st_dev && named.st_ino == held.st_ino;
}

int
mloop_open_looked_up (int looked_up, int dirfd, const char *path, int flags)
{
  char proc[64];
  int fd, saved;

  snprintf (proc, sizeof proc, "/proc/self/fd/%d", looked_up);
  fd = open (proc, flags);
  saved = errno;
  if (fd == -1 && saved == ENOENT && access ("/proc/self/fd", F_OK) == -1) {
    fd = openat (dirfd, path, flags);
    saved = errno;
  }
  errno = saved;
  return fd;
}

int
mloop_open_regular (int dirfd, const char *path, int flags,
                    bool *not_regular)
{
  struct stat st;
  int held, fd, saved;

  *not_regular = false;
  held = openat (dirfd, path, O_PATH | O_CLOEXEC);
  if (held == -1)
    return -1;
  if (fstat (held, &st) == -1) {
    saved = errno;
    close (held);
    errno = saved;
    return -1;
  }
  if (!S_ISREG (st.st_mode)) {
    close (held);
    *not_regular = true;
    errno = EINVAL;
    return -1;
  }
  fd = mloop_open_looked_up (held, dirfd, path, flags);
  saved = errno;
  close (held);
  errno = saved;
  return fd;
}

/* QEMU's lock bytes: it holds byte 100 + P while it holds permission
 * P of an image and byte 200 + P while it refuses P to others, and
 * before it takes P it tests byte 200 + P for another's lock.
 * Permission 1 is "write".
 */
#define QEMU_REFUSES_WRITE_BYTE 201

static int
lock_range (int fd, short type, off_t start, off_t len)
{
  struct flock lock = {
    .l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len,
  };

  if (fcntl (fd, F_OFD_SETLK, &lock) == 0)
    return 0;
  return errno == EACCES ? -EAGAIN : -errno;
}

int
mloop_lock_image (int fd, bool exclusive)
{
  int r;

  /* The whole file: the commit that takes it rewrites the image under
   * anyone reading or writing it, QEMU (a virtual machine's disk,
   * qemu-img) as much as mloop's servers; QEMU's byte locks all lie
   * in it.
   */
  if (exclusive)
    return lock_range (fd, F_WRLCK, 0, 0);
  /* mloop's own byte, at the far end of the offset range: not a whole
   * file read lock, which QEMU would take for an image in use and so
   * refuse even qemu-img info and map of a served image.
   */
  if ((r = lock_range (fd, F_RDLCK, INT64_MAX, 1)) < 0)
    return r;
  /* And QEMU's own "others may not write": an image served, the base
   * under overlays above all, must not change under its devices, so a
   * QEMU process that would write it is refused, in its terms.  Readers
   * (qemu-img info, map) test other bytes and are let in.
   */
  if ((r = lock_range (fd, F_RDLCK, QEMU_REFUSES_WRITE_BYTE, 1)) < 0)
    (void) lock_range (fd, F_UNLCK, INT64_MAX, 1);
  return r;
}
