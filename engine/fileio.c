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

  return fstatat (dirfd, name, &named, 0) == 0 && fstat (fd, &held) == 0 &&
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

int
mloop_lock_image (int fd, bool exclusive)
{
  /* One byte at the far end of the offset range, not the whole file:
   * QEMU's tools lock bytes 100 to 299 of every image they open (one
   * byte per permission taken or refused to others) and read any lock
   * there as an image in use, so a whole-file lock would refuse even
   * qemu-img info and map of a served image. */
  struct flock lock = {
    .l_type = exclusive ? F_WRLCK : F_RDLCK,
    .l_whence = SEEK_SET,
    .l_start = INT64_MAX,
    .l_len = 1,
  };

  if (fcntl (fd, F_OFD_SETLK, &lock) == 0)
    return 0;
  return errno == EACCES ? -EAGAIN : -errno;
}
