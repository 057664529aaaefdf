/* mloop — whole-buffer positional IO on a file.  See fileio.h. */
#include <errno.h>
#include <string.h>
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

