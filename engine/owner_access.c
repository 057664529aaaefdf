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
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "owner_access.h"

/* The child's exit codes. */
enum { MAY_WRITE = 0, MAY_NOT_WRITE = 1, CANNOT_TAKE_IDS = 2, NO_PROC = 3 };

/* The group a uid the user database does not know is given: the
 * kernel's overflow group, which owns nothing.  Not the file's group:
 * a file takes a setgid directory's group whoever makes it, so its
 * maker need not belong to it.
 */
#define NO_GROUP ((gid_t) 65534)

/* The groups of UID, its primary group first: from the user database,
 * or NO_GROUP alone for a uid it does not know (or cannot tell of).
 * *GROUPS, to free, and the count in *N; -ENOMEM.
 */
static int
groups_of (uid_t uid, char *user, size_t userlen, gid_t **groups, int *n)
{
  struct passwd pw, *found = NULL;
  size_t size = 4096;
  char *buf = NULL;
  int r;

  *n = 1;
  *groups = malloc (sizeof **groups);
  if (*groups == NULL)
    return -ENOMEM;
  (*groups)[0] = NO_GROUP;
  do {
    char *more = realloc (buf, size);

    if (more == NULL) {
      free (buf);
      return -ENOMEM;
    }
    buf = more;
    r = getpwuid_r (uid, &pw, buf, size, &found);
    size *= 2;
  } while (r == ERANGE && size <= (1u << 20));
  if (r != 0 || found == NULL) {
    snprintf (user, userlen, "uid %u", (unsigned) uid);
    free (buf);
    return 0;
  }
  snprintf (user, userlen, "%s", pw.pw_name);
  (*groups)[0] = pw.pw_gid;
  while (getgrouplist (pw.pw_name, pw.pw_gid, *groups, n) == -1) {
    gid_t *more = realloc (*groups, (size_t) *n * sizeof **groups);

    if (more == NULL) {
      free (buf);
      return -ENOMEM;
    }
    *groups = more;
  }
  free (buf);
  return 0;
}

int
mloop_owner_may_write (int owned_fd, int target_fd, char *user,
                       size_t userlen, char *err, size_t errlen)
{
  struct stat st;
  char target[64];
  gid_t *groups = NULL;
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
  r = groups_of (st.st_uid, user, userlen, &groups, &n);
  if (r < 0) {
    snprintf (err, errlen, "out of memory");
    free (groups);
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
    if (access (target, W_OK) == 0)
      _exit (MAY_WRITE);
    _exit (errno == ENOENT ? NO_PROC : MAY_NOT_WRITE);
  }
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
  if (!WIFEXITED (status) || WEXITSTATUS (status) > NO_PROC) {
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
  default:
    snprintf (err, errlen, "cannot check as %s: /proc is not mounted", user);
    return -ENOENT;
  }
}
