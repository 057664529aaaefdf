/* A FUSE file system mounted by a user who is root in a user namespace
 * of their own (unshare -Urm) is that user's, although its mountinfo
 * line says user_id=0 (the kernel prints the id as the mounting
 * namespace numbers it).  The kernel refuses root's look at such a
 * file system unless fuse's allow_sys_admin_access is set; set, the
 * service would look, and wait on a server its user stopped.  So an
 * image whose mount is such a line, seen by a caller in a user
 * namespace other than the service's, is a user's FUSE; one whose
 * caller shares the service's namespace (root's own FUSE mount, whose
 * user_id=0 means root) is not.
 *
 * Each mount is made by a child of the test, in a mount namespace of
 * its own (and a user namespace of its own mapping only root, as
 * unshare -Urm does as root), without a FUSE server: nothing asks the
 * file system anything (statx with AT_STATX_DONT_SYNC, as the service
 * does).  Root: about 0.01 s, in the unit suite of every tier; a SKIP
 * without root, /dev/fuse, user namespaces or FUSE mounts in them.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include "held_image.h"
#include "unit.h"

/* What a child says, once its mount is made or could not be. */
struct said {
  int failed;                   /* 0, or the step that failed */
  int err;                      /* its errno */
  uint64_t mnt_id;
};

enum { STEP_UNSHARE = 1, STEP_MAPS, STEP_PRIVATE, STEP_OPEN, STEP_MOUNT,
       STEP_STATX, STEP_NO_MNT_ID };

static const char *const steps[] = {
  [STEP_UNSHARE] = "unshare", [STEP_MAPS] = "write its id maps",
  [STEP_PRIVATE] = "make its mounts private",
  [STEP_OPEN] = "open /dev/fuse", [STEP_MOUNT] = "mount FUSE",
  [STEP_STATX] = "statx its mount",
  [STEP_NO_MNT_ID] = "statx (no STATX_MNT_ID: a kernel before 5.8)",
};

static pid_t children[2];

static void
end_children (void)
{
  for (size_t i = 0; i < G_N_ELEMENTS (children); i++)
    if (children[i] > 0) {
      kill (children[i], SIGKILL);
      waitpid (children[i], NULL, 0);
      children[i] = 0;
    }
}

static int
write_file (const char *path, const char *text)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);
  ssize_t n;

  if (fd == -1)
    return -1;
  n = write (fd, text, strlen (text));
  close (fd);
  return n == (ssize_t) strlen (text) ? 0 : -1;
}

/* The child: its own mount namespace (and, with USERNS, a user
 * namespace mapping only root), a FUSE mount on DIR, user_id=0, whose
 * mount id it writes to TELL; then it waits for WAIT's end.
 */
static noreturn void
child (bool userns, const char *dir, int tell, int wait)
{
  struct said said = { 0 };
  struct statx sx;
  int fd;
  char c;

  alarm (30);                   /* never outlives a stuck test */
  if (unshare (CLONE_NEWNS | (userns ? CLONE_NEWUSER : 0)) == -1) {
    said.failed = STEP_UNSHARE;
    goto out;
  }
  if (userns && (write_file ("/proc/self/setgroups", "deny") == -1 ||
                 write_file ("/proc/self/uid_map", "0 0 1") == -1 ||
                 write_file ("/proc/self/gid_map", "0 0 1") == -1)) {
    said.failed = STEP_MAPS;
    goto out;
  }
  if (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == -1) {
    said.failed = STEP_PRIVATE;
    goto out;
  }
  if ((fd = open ("/dev/fuse", O_RDWR | O_CLOEXEC)) == -1) {
    said.failed = STEP_OPEN;
    goto out;
  }
  {
    char opts[128];

    snprintf (opts, sizeof opts,
              "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
    if (mount ("mloop-test", dir, "fuse.mlooptest", MS_NOSUID | MS_NODEV,
               opts) == -1) {
      said.failed = STEP_MOUNT;
      goto out;
    }
  }
  if (statx (AT_FDCWD, dir, AT_STATX_DONT_SYNC, STATX_TYPE | STATX_MNT_ID,
             &sx) == -1) {
    said.failed = STEP_STATX;
    goto out;
  }
  if (!(sx.stx_mask & STATX_MNT_ID)) {
    said.failed = STEP_NO_MNT_ID;
    goto out;
  }
  said.mnt_id = sx.stx_mnt_id;
out:
  said.err = errno;
  if (write (tell, &said, sizeof said) != sizeof said)
    _exit (1);
  /* The mount stays while the test looks at it: until WAIT ends. */
  while (read (wait, &c, 1) == -1 && errno == EINTR)
    ;
  _exit (0);
}

/* What mloop_held_image_mount says of a FUSE mount, user_id=0, made by
 * a child in a mount namespace of its own (and with USERNS, a user
 * namespace) on DIR.  SLOT: which of CHILDREN it is.
 */
static enum mloop_held_mount
look (bool userns, const char *dir, size_t slot, unsigned *mounter)
{
  int tell[2], wait[2];
  struct said said;
  enum mloop_held_mount found;
  pid_t pid;

  CHECK (pipe2 (tell, O_CLOEXEC) == 0 && pipe2 (wait, O_CLOEXEC) == 0,
         "pipe: %s", strerror (errno));
  pid = fork ();
  CHECK (pid != -1, "fork: %s", strerror (errno));
  if (pid == 0) {
    close (tell[0]);
    close (wait[1]);
    child (userns, dir, tell[1], wait[0]);
  }
  children[slot] = pid;
  close (tell[1]);
  close (wait[0]);
  CHECK (read (tell[0], &said, sizeof said) == sizeof said,
         "the child said nothing");
  close (tell[0]);
  if (said.failed) {
    const char *step = steps[said.failed];

    if (said.failed == STEP_STATX)
      unit_fail (__FILE__, __LINE__, "statx", "%s: %s", step,
                 strerror (said.err));
    unit_skip ("a child in a %s namespace of its own could not %s: %s",
               userns ? "user and mount" : "mount", step,
               strerror (said.err));
  }
  found = mloop_held_image_mount (pid, said.mnt_id, 0, 0, mounter);
  close (wait[1]);
  waitpid (pid, NULL, 0);
  children[slot] = 0;
  return found;
}

int
main (void)
{
  const char *dir;
  unsigned mounter = 12345;
  enum mloop_held_mount found;

  if (geteuid () != 0)
    unit_skip ("needs root: it mounts FUSE in namespaces");
  if (access ("/dev/fuse", R_OK | W_OK) == -1)
    unit_skip ("/dev/fuse: %s", strerror (errno));
  unit_deadline (20);
  atexit (end_children);
  /* Mounted on only in the children's namespaces. */
  dir = unit_tmpdir ("/tmp");

  /* Root's own FUSE mount, the caller in the service's user namespace:
   * user_id=0 is root, and its mount is seen.
   */
  found = look (false, dir, 0, &mounter);
  CHECK (found == MLOOP_HELD_MOUNT_SEEN, "root's FUSE mount, seen by a "
         "caller in the service's user namespace: %d, not SEEN (%d)",
         (int) found, (int) MLOOP_HELD_MOUNT_SEEN);

  /* A FUSE mount made where its user is root, seen by a caller there:
   * user_id=0 all the same, but theirs.
   */
  mounter = 12345;
  found = look (true, dir, 1, &mounter);
  CHECK (found == MLOOP_HELD_MOUNT_USERS_FUSE, "a FUSE mount of a user "
         "namespace (user_id=0 there), seen by a caller in it: %d, not "
         "USERS_FUSE (%d)", (int) found, (int) MLOOP_HELD_MOUNT_USERS_FUSE);
  CHECK (mounter == 0, "the mounter said is %u, not 0 (as the mount's "
         "namespace numbers it)", mounter);
  return 0;
}
