/* Atomic small files: write a temporary name, fsync-free (these files
 * matter only while this boot lasts), rename over PATH. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "files.h"

int
ublk_write_file_atomic (const char *path, const char *text, char *err,
                        size_t errlen)
{
  char tmp[4096];
  if ((size_t) snprintf (tmp, sizeof tmp, "%s.tmp.%d", path, (int) getpid ())
      >= sizeof tmp) {
    snprintf (err, errlen, "%s: %s", path, strerror (ENAMETOOLONG));
    return -1;
  }
  int fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf (err, errlen, "%s: %s", tmp, strerror (errno));
    return -1;
  }
  size_t len = strlen (text), done = 0;
  while (done < len) {
    ssize_t n = write (fd, text + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      snprintf (err, errlen, "%s: %s", tmp, strerror (n < 0 ? errno : EIO));
      close (fd);
      unlink (tmp);
      return -1;
    }
    done += (size_t) n;
  }
  if (close (fd) < 0 || rename (tmp, path) < 0) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    unlink (tmp);
    return -1;
  }
  return 0;
}
