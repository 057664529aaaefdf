/* The control socket's messages (control/message.c) between two ends
 * of a real SOCK_SEQPACKET socket pair: a request with fields and two
 * descriptors arrives whole and the descriptors work; every malformed
 * or oversized datagram a caller could send is refused in one line, and
 * whatever descriptors came with it are closed, none left open in the
 * receiver.  About 0.01 s, in the unit suite of every tier.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "message.h"
#include "unit.h"

static int
open_fds (void)
{
  DIR *d = opendir ("/proc/self/fd");
  int n = 0;

  CHECK (d != NULL, "opendir /proc/self/fd: %s", strerror (errno));
  while (readdir (d))
    n++;
  closedir (d);
  return n;
}

/* Sends LEN raw bytes with N_FDS descriptors (copies of stdin) on S. */
static void
send_raw (int s, const void *data, size_t len, size_t n_fds)
{
  int fds[MLOOP_CONTROL_MAX_FDS + 1];
  char space[CMSG_SPACE (sizeof fds)];
  struct iovec iov = { .iov_base = (void *) data, .iov_len = len };
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };

  if (n_fds > 0) {
    struct cmsghdr *c;

    for (size_t i = 0; i < n_fds; i++)
      fds[i] = dup (0);
    memset (space, 0, sizeof space);
    msg.msg_control = space;
    msg.msg_controllen = CMSG_SPACE (sizeof (int) * n_fds);
    c = CMSG_FIRSTHDR (&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN (sizeof (int) * n_fds);
    memcpy (CMSG_DATA (c), fds, sizeof (int) * n_fds);
  }
  CHECK (sendmsg (s, &msg, 0) == (ssize_t) len, "sendmsg: %s",
         strerror (errno));
  for (size_t i = 0; i < n_fds; i++)
    close (fds[i]);
}

/* A datagram of LEN bytes with N_FDS descriptors must be refused with a
 * reason containing WHY, and leave no descriptor open.
 */
static void
expect_refused (int tx, int rx, const void *data, size_t len, size_t n_fds,
                const char *why)
{
  static struct mloop_control_in in;
  char err[256] = "";
  int before = open_fds (), r;

  send_raw (tx, data, len, n_fds);
  r = mloop_control_recv (rx, &in, err, sizeof err);
  CHECK (r == -1, "a bad request (%s) was taken (%d)", why, r);
  CHECK (strstr (err, why) != NULL, "refusal '%s' does not say '%s'", err,
         why);
  CHECK (open_fds () == before, "refusal '%s' left %d descriptors open", err,
         open_fds () - before);
}

int
main (void)
{
  static struct mloop_control_out out;
  static struct mloop_control_in in;
  static char big[MLOOP_CONTROL_MAX_BYTES + 100];
  char err[256] = "";
  int sv[2], pipefd[2], fds[2], r;
  char byte;

  unit_deadline (10);
  CHECK (socketpair (AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0, "socketpair: %s",
         strerror (errno));

  /* A whole request, a value holding '=' and bytes that are not text. */
  CHECK (pipe (pipefd) == 0, "pipe");
  mloop_control_out_init (&out);
  CHECK (mloop_control_add (&out, "op", "attach"), "add op");
  CHECK (mloop_control_add (&out, "image", "/var/tmp/a=b\xff.img"), "add");
  CHECK (!mloop_control_add (&out, "op", "detach"), "a key taken twice");
  CHECK (!mloop_control_add (&out, "Op", "x"), "an upper-case key taken");
  mloop_control_out_init (&out);
  CHECK (mloop_control_add (&out, "op", "attach"), "add op");
  CHECK (mloop_control_add (&out, "image", "/var/tmp/a=b\xff.img"), "add");
  fds[0] = pipefd[0];
  fds[1] = pipefd[1];
  CHECK (mloop_control_send (sv[0], &out, fds, 2) == 0, "send: %s",
         strerror (errno));
  r = mloop_control_recv (sv[1], &in, err, sizeof err);
  CHECK (r == 1, "recv: %d %s", r, err);
  CHECK (in.n_fields == 2 && in.n_fds == 2, "%zu fields, %zu fds",
         in.n_fields, in.n_fds);
  CHECK (strcmp (mloop_control_get (&in, "op"), "attach") == 0, "op");
  CHECK (strcmp (mloop_control_get (&in, "image"), "/var/tmp/a=b\xff.img") == 0,
         "image is '%s'", mloop_control_get (&in, "image"));
  CHECK (mloop_control_get (&in, "size") == NULL, "a missing key found");
  CHECK (fcntl (in.fds[0], F_GETFD) & FD_CLOEXEC, "not close-on-exec");
  CHECK (write (pipefd[1], "x", 1) == 1, "write");
  r = mloop_control_take_fd (&in, 0);
  CHECK (read (r, &byte, 1) == 1 && byte == 'x', "the passed pipe is not it");
  close (r);
  CHECK (mloop_control_take_fd (&in, 0) == -1, "a descriptor taken twice");
  CHECK (mloop_control_take_fd (&in, MLOOP_CONTROL_MAX_FDS) == -1,
         "a descriptor out of range");
  mloop_control_in_clear (&in);
  close (pipefd[0]);
  close (pipefd[1]);

  /* What the sender refuses to send. */
  mloop_control_out_init (&out);
  memset (big, 'x', sizeof big - 1);
  big[MLOOP_CONTROL_MAX_BYTES - 4] = '\0';
  CHECK (!mloop_control_add (&out, "image", big), "an oversized field");
  CHECK (mloop_control_send (sv[0], &out, NULL, 0) == -1 && errno == EMSGSIZE,
         "an oversized message sent");

  /* What the receiver refuses, descriptors and all. */
  expect_refused (sv[0], sv[1], "op=attach", 9, 2, "no end");
  expect_refused (sv[0], sv[1], "op=attach\0\0", 11, 1, "not key=value");
  expect_refused (sv[0], sv[1], "attach\0", 7, 0, "not key=value");
  expect_refused (sv[0], sv[1], "OP=attach\0", 10, 0, "not key=value");
  expect_refused (sv[0], sv[1], "=attach\0", 8, 0, "not key=value");
  expect_refused (sv[0], sv[1], "op=a\0op=b\0", 10, 3, "given twice");
  expect_refused (sv[0], sv[1], "op=attach\0", 10, MLOOP_CONTROL_MAX_FDS + 1,
                  "descriptors");
  memset (big, 0, sizeof big);
  for (int i = 0; i <= MLOOP_CONTROL_MAX_FIELDS; i++)
    snprintf (big + i * 7, 7, "k%03d=v", i);
  expect_refused (sv[0], sv[1], big, (MLOOP_CONTROL_MAX_FIELDS + 1) * 7, 0,
                  "fields");
  memset (big, 'x', sizeof big);
  memcpy (big, "op=", 3);
  big[sizeof big - 1] = '\0';
  expect_refused (sv[0], sv[1], big, sizeof big, 2, "bytes");

  /* The peer is this process. */
  {
    struct ucred cred;

    CHECK (mloop_control_peer (sv[1], &cred) == 0, "SO_PEERCRED: %s",
           strerror (errno));
    CHECK (cred.pid == getpid () && cred.uid == getuid (), "peer %d/%u",
           (int) cred.pid, (unsigned) cred.uid);
  }
  close (sv[0]);
  r = mloop_control_recv (sv[1], &in, err, sizeof err);
  CHECK (r == 0, "a closed peer read as %d (%s)", r, err);
  close (sv[1]);
  return 0;
}
