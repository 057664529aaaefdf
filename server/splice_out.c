/* mloop-server — READ data sent to a Unix socket by page reference.
 * See splice_out.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "splice_out.h"

/* Room in the pipe for a 1 MiB reply in one go: the most an unprivileged
 * process may ask for by default (fs.pipe-max-size).  The pipe only holds
 * page references, so its size costs no copy; a smaller pipe (the
 * request refused) means more calls per reply, not less correctness.
 */
#define PIPE_SIZE (1 << 20)

static bool
is_unix_stream (int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int type;
  socklen_t tlen = sizeof type;

  return getsockname (fd, (struct sockaddr *) &ss, &len) == 0 &&
    ss.ss_family == AF_UNIX &&
    getsockopt (fd, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 &&
    type == SOCK_STREAM;
}

bool
splice_out_works (void)
{
  size_t page = (size_t) sysconf (_SC_PAGESIZE);
  int sv[2] = { -1, -1 }, p[2] = { -1, -1 };
  char *sent = NULL, *got = NULL;
  struct iovec iov;
  bool ok = false;
  int saved;

  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == -1 ||
      pipe2 (p, O_CLOEXEC) == -1 ||
      posix_memalign ((void **) &sent, page, page) != 0 ||
      (got = malloc (page)) == NULL)
    goto out;
  memset (sent, 0x5a, page);
  iov = (struct iovec) { .iov_base = sent, .iov_len = page };
  /* Blocking calls on fresh, empty ends: each moves the page whole. */
  if (vmsplice (p[1], &iov, 1, 0) != (ssize_t) page ||
      splice (p[0], NULL, sv[0], NULL, page, SPLICE_F_MOVE) != (ssize_t) page ||
      recv (sv[1], got, page, MSG_WAITALL) != (ssize_t) page)
    goto out;
  ok = memcmp (sent, got, page) == 0;
  if (!ok)
    errno = EIO;
 out:
  saved = errno;
  for (int i = 0; i < 2; i++) {
    if (sv[i] != -1)
      close (sv[i]);
    if (p[i] != -1)
      close (p[i]);
  }
  free (sent);
  free (got);
  errno = saved;
  return ok;
}

int
splice_out_open (struct splice_out *z, int fd)
{
  int p[2];
  int fl;

  *z = (struct splice_out) { .pipe_rd = -1, .pipe_wr = -1 };
  if (!is_unix_stream (fd))
    return 0;
  /* splice into a socket blocks unless the socket itself is
   * non-blocking; recv and sendmsg here pass MSG_DONTWAIT anyway.
   */
  fl = fcntl (fd, F_GETFL);
  if (fl == -1 || fcntl (fd, F_SETFL, fl | O_NONBLOCK) == -1 ||
      pipe2 (p, O_NONBLOCK | O_CLOEXEC) == -1)
    return -1;
  (void) fcntl (p[1], F_SETPIPE_SZ, PIPE_SIZE);
  z->pipe_rd = p[0];
  z->pipe_wr = p[1];
  return 1;
}

void
splice_out_close (struct splice_out *z)
{
  if (z->pipe_rd != -1) {
    close (z->pipe_rd);
    close (z->pipe_wr);
  }
  z->pipe_rd = z->pipe_wr = -1;
}

ssize_t
splice_out_lend (struct splice_out *z, const void *buf, size_t len)
{
  struct iovec iov = { .iov_base = (void *) buf, .iov_len = len };
  ssize_t n;

  /* No SPLICE_F_GIFT: the pages stay ours and are referenced, not
   * moved; splice_out_returned() says when they are free again.
   */
  do
    n = vmsplice (z->pipe_wr, &iov, 1, SPLICE_F_NONBLOCK);
  while (n == -1 && errno == EINTR);
  if (n == -1 && errno == EAGAIN)
    return 0;
  if (n > 0)
    z->in_pipe += (size_t) n;
  return n;
}

int
splice_out_drain (struct splice_out *z, int fd)
{
  while (z->in_pipe > 0) {
    ssize_t n = splice (z->pipe_rd, NULL, fd, NULL, z->in_pipe,
                        SPLICE_F_NONBLOCK | SPLICE_F_MOVE);

    if (n == -1 && errno == EINTR)
      continue;
    if (n == -1 && errno == EAGAIN)
      return 1;
    if (n <= 0) {
      if (n == 0)
        errno = EPIPE;
      return -1;
    }
    z->in_pipe -= (size_t) n;
    z->to_socket += (uint64_t) n;
  }
  return 0;
}

bool
splice_out_returned (const struct splice_out *z, int fd, uint64_t end)
{
  int unread;

  if (end > z->to_socket)
    return false;               /* still in the pipe */
  if (ioctl (fd, SIOCOUTQ, &unread) == -1)
    return false;
  return (uint64_t) unread <= z->to_socket - end;
}

void
splice_out_forget (void *buf, size_t cap)
{
  /* Anonymous private memory: the range reads as zeroes from now on and
   * the old pages belong to whoever still references them.
   */
  (void) madvise (buf, cap, MADV_DONTNEED);
}
