/* mloop — whether the owner of one file may write another.  See
 * owner_access.h.
 *
 * Asked of the kernel, not worked out from the mode bits: a child
 * process takes the owner's uid, gid and supplementary groups and asks
 * access(W_OK) of the target through /proc/self/fd, so ACLs (a named
 * user's entry, the group mask), read-only mounts, immutable files and
 * security modules all count, exactly as for that user's own open.  A
 * child, not setfsuid() in this process: the ids it takes, the groups
 * above all (setgroups() changes every thread), die with it, and no
 * other thread ever runs with them.
 *
 * The /proc/self/fd entry leads to the file without a look at the
 * directories on its path, so the child first looks the target up by
 * its path, with those ids: a file anyone may write behind a directory
 * only root may enter is not the owner's to write.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/openat2.h>

#include "owner_access.h"
#include "user_db.h"

/* The child's exit codes. */
enum {
  MAY_WRITE = 0, MAY_NOT_WRITE = 1, CANNOT_TAKE_IDS = 2, NO_PROC = 3,
  REPLACED = 4,
};

/* The group a uid the user database does not know is given: the
 * kernel's overflow group, which owns nothing.  Not the file's group:
 * a file takes a setgid directory's group whoever makes it, so its
 * maker need not belong to it.
 */
#define NO_GROUP ((gid_t) 65534)

/* Room for the groups of most users on the caller's stack: the check's
 * child (system calls only) cannot free a heap block of its parent's,
 * which valgrind would then count as lost in it.
 */
#define GROUPS_ON_STACK 64

/* The groups of UID, its primary group first: from the user database,
 * or NO_GROUP alone for a uid it does not know (or cannot tell of).
 * In ROOM (GROUPS_ON_STACK of them) when they fit, else in a block to
 * free; *GROUPS says which, the count in *N.  0, or -ENOMEM.
 */
static int
groups_of (uid_t uid, char *user, size_t userlen, gid_t *room,
           gid_t **groups, int *n)
{
  struct passwd pw;
  char *buf = NULL;

  *n = 1;
  *groups = room;
  room[0] = NO_GROUP;
  if (mloop_user_by_uid (uid, &pw, &buf) == -1) {
    free (buf);
    if (errno == ENOMEM)
      return -ENOMEM;
    snprintf (user, userlen, "uid %u", (unsigned) uid);
    return 0;
  }
  snprintf (user, userlen, "%s", pw.pw_name);
  room[0] = pw.pw_gid;
  *n = GROUPS_ON_STACK;
  while (getgrouplist (pw.pw_name, pw.pw_gid, *groups, n) == -1) {
    gid_t *more = realloc (*groups == room ? NULL : *groups,
                           (size_t) *n * sizeof **groups);

    if (more == NULL) {
      if (*groups != room)
        free (*groups);
      *groups = room;
      free (buf);
      return -ENOMEM;
    }
    *groups = more;
  }
  free (buf);
  return 0;
}

/* In the child, with the owner's ids: whether TARGET_PATH leads, through
 * no symbolic link and directories the owner may search, to the file of
 * status HELD.  An exit code: MAY_WRITE when it does (the rest of the
 * check follows), MAY_NOT_WRITE when the owner cannot reach it there,
 * REPLACED when the path names another file now.  System calls only.
 */
static int
owner_reaches (const char *target_path, const struct stat *held)
{
  struct open_how how = {
    .flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_NO_SYMLINKS,
  };
  struct stat named;
  int fd, r;

  fd = (int) syscall (SYS_openat2, AT_FDCWD, target_path, &how, sizeof how);
  /* A kernel before 5.6: the caller has refused links on the path, and
   * a file swapped in since is told by its inode below.
   */
  if (fd == -1 && errno == ENOSYS)
    fd = open (target_path, O_PATH | O_CLOEXEC);
  if (fd == -1)
    return MAY_NOT_WRITE;
  r = fstat (fd, &named);
  close (fd);
  if (r == -1)
    return MAY_NOT_WRITE;
  return named.st_dev == held->st_dev && named.st_ino == held->st_ino
    ? MAY_WRITE : REPLACED;
}

int
mloop_owner_may_write (int owned_fd, int target_fd, const char *target_path,
                       char *user, size_t userlen, char *err, size_t errlen)
{
  struct stat st, held;
  char target[64];
  gid_t room[GROUPS_ON_STACK], *groups = room;
  gid_t gid;
  int n, r, status;
  pid_t pid;

  if (fstat (owned_fd, &st) == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot tell who owns it: %s", strerror (-r));
    return r;
  }
  if (st.st_uid == 0 || st.st_uid == geteuid ())
    return 1;
  if (fstat (target_fd, &held) == -1) {
    r = -errno;
    snprintf (err, errlen, "%s: %s", target_path, strerror (-r));
    return r;
  }
  r = groups_of (st.st_uid, user, userlen, room, &groups, &n);
  if (r < 0) {
    snprintf (err, errlen, "out of memory");
    return r;
  }
  gid = groups[0];
  /* Formatted before the fork: the child makes only system calls. */
  snprintf (target, sizeof target, "/proc/self/fd/%d", target_fd);
  pid = fork ();
  if (pid == 0) {
    if (setgroups ((size_t) n, groups) == -1 || setgid (gid) == -1 ||
        setuid (st.st_uid) == -1)
      _exit (CANNOT_TAKE_IDS);
    if ((r = owner_reaches (target_path, &held)) != MAY_WRITE)
      _exit (r);
    if (access (target, W_OK) == 0)
      _exit (MAY_WRITE);
    _exit (errno == ENOENT ? NO_PROC : MAY_NOT_WRITE);
  }
  if (groups != room)
    free (groups);
  if (pid == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot check as %s: %s", user, strerror (-r));
    return r;
  }
  while (waitpid (pid, &status, 0) == -1)
    if (errno != EINTR) {
      r = -errno;
      snprintf (err, errlen, "cannot check as %s: %s", user, strerror (-r));
      return r;
    }
  if (!WIFEXITED (status) || WEXITSTATUS (status) > REPLACED) {
    snprintf (err, errlen, "cannot check as %s: the check failed", user);
    return -EIO;
  }
  switch (WEXITSTATUS (status)) {
  case MAY_WRITE:
    return 1;
  case MAY_NOT_WRITE:
    return 0;
  case CANNOT_TAKE_IDS:
    snprintf (err, errlen, "cannot check as %s: only root may take "
              "another user's ids", user);
    return -EPERM;
  case REPLACED:
    snprintf (err, errlen, "%s names another file now", target_path);
    return -ESTALE;
  default:
    snprintf (err, errlen, "cannot check as %s: /proc is not mounted", user);
    return -ENOENT;
  }
}
