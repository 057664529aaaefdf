/* The Ceph configuration an RBD device records is one only root can
 * lead elsewhere.  Each of the device's servers, root's, opens it again
 * by name when it starts (a restart, mloopd's next start), judging the
 * file it opens then: any regular file of root's no one else may write
 * passes.  A user who owns a directory on the way, a symbolic link
 * followed there, or may write a directory that is not sticky, could
 * swap the name for another file of root's between two starts: another
 * cluster's configuration, whose image of that name the device would
 * then serve.  Such a path is refused at attach, named or found by the
 * search; one through root's own links and sticky directories is not.
 *
 * No Ceph: the name is only pinned.  About 0.01 s, in the unit suite
 * of every tier; a SKIP without root (the directories need owners).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "store_name.h"
#include "unit.h"

#define USER_UID 65534

static char *
make_conf (const char *dir)
{
  char *path = g_build_filename (dir, "ceph.conf", NULL);
  FILE *f = fopen (path, "w");

  CHECK (f != NULL, "%s: cannot make it", path);
  fprintf (f, "[global]\nmon_host = 192.0.2.1\n");
  fclose (f);
  CHECK (chmod (path, 0644) == 0, "chmod %s", path);
  return path;
}

static char *
make_dir (const char *top, const char *name, mode_t mode, uid_t owner)
{
  char *dir = g_build_filename (top, name, NULL);

  CHECK (mkdir (dir, 0755) == 0 && chmod (dir, mode) == 0 &&
         chown (dir, owner, 0) == 0, "making %s", dir);
  return dir;
}

/* The name attach would record for --ceph-conf CONF, or NULL with ERR. */
static char *
pinned_with (const char *conf, char *err, size_t errlen)
{
  g_autofree char *with = mloop_rbd_name_with ("rbd:pool/img", conf, NULL,
                                               err, errlen);

  CHECK (with != NULL, "--ceph-conf %s refused before pinning: %s", conf,
         err);
  return mloop_rbd_name_pinned (with, err, errlen);
}

static void
refused (const char *conf, const char *what, const char *names)
{
  char err[2048] = "";
  g_autofree char *pinned = pinned_with (conf, err, sizeof err);

  CHECK (pinned == NULL, "--ceph-conf %s (%s) recorded: %s", conf, what,
         pinned);
  CHECK (strstr (err, names) != NULL, "--ceph-conf %s (%s): the refusal "
         "does not name %s: %s", conf, what, names, err);
}

static void
accepted (const char *conf, const char *what)
{
  char err[2048] = "";
  g_autofree char *pinned = pinned_with (conf, err, sizeof err);

  CHECK (pinned != NULL, "--ceph-conf %s (%s) refused: %s", conf, what, err);
}

int
main (void)
{
  const char *top;
  g_autofree char *users = NULL, *open_dir = NULL, *sticky = NULL;
  g_autofree char *roots = NULL, *in_users = NULL, *in_open = NULL;
  g_autofree char *in_sticky = NULL, *in_roots = NULL;
  g_autofree char *users_link = NULL, *roots_link = NULL;
  g_autofree char *through_users = NULL;
  char err[2048] = "";
  char *pinned;

  if (geteuid () != 0)
    unit_skip ("needs root to give directories other owners");
  top = unit_tmpdir ("/var/tmp");
  CHECK (chmod (top, 0755) == 0, "chmod %s", top);
  unsetenv ("CEPH_ARGS");
  unsetenv ("CEPH_KEYRING");
  unsetenv ("CEPH_LIB");
  unsetenv ("CEPH_CONF");

  users = make_dir (top, "users", 0755, USER_UID);
  open_dir = make_dir (top, "open", 0777, 0);
  sticky = make_dir (top, "sticky", 01777, 0);
  roots = make_dir (top, "roots", 0755, 0);
  in_users = make_conf (users);
  in_open = make_conf (open_dir);
  in_sticky = make_conf (sticky);
  in_roots = make_conf (roots);

  refused (in_users, "in a user's directory", users);
  refused (in_open, "in a directory anyone may write", open_dir);
  accepted (in_sticky, "root's file in a sticky directory");
  accepted (in_roots, "in root's directory");

  /* A user's link in a sticky directory, to root's file: they may
   * point it elsewhere at any time.
   */
  users_link = g_build_filename (sticky, "link.conf", NULL);
  CHECK (symlink (in_roots, users_link) == 0 &&
         lchown (users_link, USER_UID, 0) == 0, "making %s", users_link);
  refused (users_link, "a user's link", users_link);
  /* Root's link through root's directories: what it leads to counts. */
  roots_link = g_build_filename (roots, "link.conf", NULL);
  CHECK (symlink (in_roots, roots_link) == 0, "making %s", roots_link);
  accepted (roots_link, "root's link to root's file");
  /* Root's link into a user's directory: that directory counts. */
  through_users = g_build_filename (roots, "users", NULL);
  CHECK (symlink (users, through_users) == 0, "making %s", through_users);
  {
    g_autofree char *conf = g_build_filename (through_users, "ceph.conf",
                                              NULL);

    refused (conf, "through root's link to a user's directory", users);
  }

  /* /proc's links lead to another place in each process: the attach's
   * working directory here, / in each server.
   */
  CHECK (chdir (roots) == 0, "cd %s", roots);
  refused ("/proc/self/cwd/ceph.conf", "through /proc/self/cwd",
           "/proc/self");
  CHECK (chdir ("/") == 0, "cd /");
  /* Nor any other entry of /proc: a pid's files are the next process's
   * with that pid.
   */
  refused ("/proc/1/environ", "an entry of /proc", "/proc/1");

  /* Found by the search ($CEPH_CONF) in a user's directory. */
  setenv ("CEPH_CONF", in_users, 1);
  pinned = mloop_rbd_name_pinned ("rbd:pool/img", err, sizeof err);
  CHECK (pinned == NULL, "$CEPH_CONF=%s recorded: %s", in_users, pinned);
  CHECK (strstr (err, users) != NULL, "$CEPH_CONF=%s: the refusal does not "
         "name %s: %s", in_users, users, err);
  unsetenv ("CEPH_CONF");

  printf ("ok: an RBD device's configuration path is one only root can "
          "lead elsewhere\n");
  return 0;
}
