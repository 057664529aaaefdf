/* mloop — whole-buffer IO on blocking sockets. */
#include <errno.h>
#include <sys/socket.h>

#include "sockio.h"

int
mloop_recv_full (int fd, void *buf, size_t n)
{
  char *p = buf;

  while (n > 0) {
    ssize_t r = recv (fd, p, n, 0);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == 0)
      errno = ECONNRESET;
    if (r <= 0)
      return -1;                /* EOF, timeout or error */
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

int
mloop_send_full (int fd, const void *buf, size_t n)
{
  const char *p = buf;

  while (n > 0) {
    ssize_t r = send (fd, p, n, MSG_NOSIGNAL);

    if (r == -1 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t) r;
  }
  return 0;
}
