/* A base handed to a server as /proc/self/fd/N, opened by a caller in
 * another mount namespace (a service's PrivateTmp): the link names the
 * file by the caller's view, where the server's finds nothing there, or
 * another file.  An overlay records its base by a path, so it is
 * refused, safely; the refusal must say why, not that the file was
 * "replaced while being opened".
 *
 * The caller is a child in a mount namespace of its own, with one
 * directory bound over another, which sends the file it opened there.
 * Needs root (a mount namespace): else it skips.  About 0.03 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

/* In a child with a mount namespace of its own and HIDDEN bound over
 * SHOWN, opens SHOWN/base.img and sends it on SOCK.  Exits 77 where no
 * namespace or mount can be made.
 */
static void
open_in_other_namespace (int sock, const char *hidden, const char *shown)
{
  char path[4096], ctl[CMSG_SPACE (sizeof (int))];
  char byte = 0;
  struct iovec iov = { &byte, 1 };
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl, .msg_controllen = sizeof ctl };
  struct cmsghdr *c;
  int fd;

  if (unshare (CLONE_NEWNS) == -1)
    _exit (77);
  /* A container may deny mounts even to its root.  ("none": these
   * mounts take no type, and valgrind reads a NULL one as a bad pointer.)
   */
  if (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == -1 ||
      mount (hidden, shown, "none", MS_BIND, NULL) == -1)
    _exit (errno == EPERM || errno == EACCES ? 77 : 2);
  snprintf (path, sizeof path, "%s/base.img", shown);
  if ((fd = open (path, O_RDONLY | O_CLOEXEC)) == -1)
    _exit (3);
  memset (ctl, 0, sizeof ctl);
  c = CMSG_FIRSTHDR (&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN (sizeof (int));
  memcpy (CMSG_DATA (c), &fd, sizeof fd);
  _exit (sendmsg (sock, &msg, 0) == 1 ? 0 : 4);
}

/* The descriptor the child sends, or -1 when it skipped. */
static int
receive_base (const char *hidden, const char *shown)
{
  char ctl[CMSG_SPACE (sizeof (int))], byte;
  struct iovec iov = { &byte, 1 };
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = ctl, .msg_controllen = sizeof ctl };
  int sv[2], status, fd = -1;
  pid_t pid;

  CHECK (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
         "socketpair: %s", strerror (errno));
  pid = fork ();
  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0)
    open_in_other_namespace (sv[1], hidden, shown);
  close (sv[1]);
  CHECK (waitpid (pid, &status, 0) == pid && WIFEXITED (status),
         "the caller did not exit");
  if (WEXITSTATUS (status) == 77)
    return -1;
  CHECK (WEXITSTATUS (status) == 0, "the caller failed (%d)",
         WEXITSTATUS (status));
  CHECK (recvmsg (sv[0], &msg, 0) == 1 && CMSG_FIRSTHDR (&msg) != NULL,
         "recvmsg: %s", strerror (errno));
  memcpy (&fd, CMSG_DATA (CMSG_FIRSTHDR (&msg)), sizeof fd);
  close (sv[0]);
  return fd;
}

/* Opens the overlay at OV_PATH over the held descriptor FD: refused,
 * saying why.
 */
static void
check_refused (int fd, const char *ov_path, const char *what)
{
  char held[64], err[1024];
  int r;

  snprintf (held, sizeof held, "/proc/self/fd/%d", fd);
  r = unit_try_open_overlay (held, ov_path, MLOOP_OVERLAY_SAME_BASE, err,
                             sizeof err);
  CHECK (r < 0, "an overlay recorded a held base %s", what);
  CHECK (strstr (err, "mount namespace") != NULL &&
         strstr (err, "replaced") == NULL && strchr (err, '\n') == NULL,
         "the refusal of a held base %s does not say why: %s", what, err);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char hidden[2048], shown[2048], path[4096], ov_path[4096];
  int fd;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (hidden, sizeof hidden, "%s/hidden", dir);
  snprintf (shown, sizeof shown, "%s/shown", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);
  CHECK (mkdir (hidden, 0700) == 0 && mkdir (shown, 0700) == 0,
         "mkdir: %s", strerror (errno));
  snprintf (path, sizeof path, "%s/base.img", hidden);
  unit_make_image (path, BASE_SIZE);

  if ((fd = receive_base (hidden, shown)) == -1)
    unit_skip ("no mount namespace can be made here");
  check_refused (fd, ov_path, "whose path names nothing here");

  snprintf (path, sizeof path, "%s/base.img", shown);
  unit_make_image (path, BASE_SIZE);
  check_refused (fd, ov_path, "whose path names another file here");
  close (fd);
  printf ("ok: a held base from another mount namespace is refused, "
          "saying why\n");
  return 0;
}
