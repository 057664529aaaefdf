/* The walk each RBD server makes of its configuration's path before
 * reading it (engine/trusted_path.h), as the store does at every start,
 * not only `mloop attach` before recording it.  A device records
 * /tmp/c2/ceph.conf, root's file in root's directory in sticky /tmp:
 * it passes.  A /tmp cleaner then removes c2; any user may make c2
 * again there, holding ceph.conf, a link to another cluster's
 * configuration of root's, which the judgement of the file alone (a
 * root file no one else may write) passes: the walk must refuse it,
 * naming the user's directory.  The walk is the engine's (libc only, the
 * store module builds it); the cases that follow check that it goes
 * where the kernel goes: ".." after a link from the link's target, a
 * loop of links ended, a long link's text read whole, a relative path
 * refused.
 *
 * No Ceph, no store: the walk alone.  About 0.01 s, in the unit suite
 * of every tier; a SKIP without root (the directories need owners).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "trusted_path.h"
#include "unit.h"

#define USER_UID 65534

static char *
join (const char *dir, const char *name)
{
  char *path;

  CHECK (asprintf (&path, "%s/%s", dir, name) > 0, "no memory");
  return path;
}

static char *
make_dir (const char *top, const char *name, mode_t mode, uid_t owner)
{
  char *dir = join (top, name);

  CHECK (mkdir (dir, 0755) == 0 && chmod (dir, mode) == 0 &&
         chown (dir, owner, 0) == 0, "making %s: %s", dir, strerror (errno));
  return dir;
}

static char *
make_conf (const char *dir, const char *name)
{
  char *path = join (dir, name);
  FILE *f = fopen (path, "w");

  CHECK (f != NULL, "%s: cannot make it", path);
  fprintf (f, "[global]\nmon_host = 192.0.2.1\n");
  fclose (f);
  CHECK (chmod (path, 0644) == 0, "chmod %s", path);
  return path;
}

static void
refused (const char *path, const char *what, const char *names)
{
  char why[2048] = "";

  CHECK (!mloop_path_trusted (path, why, sizeof why), "%s (%s) passed",
         path, what);
  CHECK (strstr (why, names) != NULL, "%s (%s): the refusal does not name "
         "%s: %s", path, what, names, why);
  CHECK (strchr (why, '\n') == NULL, "%s (%s): the refusal is not one "
         "line: %s", path, what, why);
}

static void
accepted (const char *path, const char *what)
{
  char why[2048] = "";

  CHECK (mloop_path_trusted (path, why, sizeof why), "%s (%s) refused: %s",
         path, what, why);
}

int
main (void)
{
  const char *top;
  char *sticky, *c2, *recorded, *other_dir, *other, *roots, *up, *link;
  char *loop_a, *loop_b, *long_dir, *long_link;
  char name[201];

  if (geteuid () != 0)
    unit_skip ("needs root to give directories other owners");
  top = unit_tmpdir ("/var/tmp");
  CHECK (chmod (top, 0755) == 0, "chmod %s", top);

  /* Attach's walk and the first server's: root's directory in a sticky
   * one passes.
   */
  sticky = make_dir (top, "sticky", 01777, 0);
  c2 = make_dir (sticky, "c2", 0755, 0);
  recorded = make_conf (c2, "ceph.conf");
  accepted (recorded, "root's file in root's directory in a sticky one");

  /* The next server's, after a cleaner and a user. */
  other_dir = make_dir (top, "other", 0755, 0);
  other = make_conf (other_dir, "other.conf");
  CHECK (unlink (recorded) == 0 && rmdir (c2) == 0, "removing %s", c2);
  free (make_dir (sticky, "c2", 0755, USER_UID));
  CHECK (symlink (other, recorded) == 0 &&
         lchown (recorded, USER_UID, 0) == 0, "making %s", recorded);
  refused (recorded, "a user's directory made again in its place", c2);
  /* Even root's own link there: the directory is the user's. */
  CHECK (lchown (recorded, 0, 0) == 0, "lchown %s", recorded);
  refused (recorded, "root's link in a user's directory", c2);

  /* ".." after a link goes up from its target, as the kernel goes:
   * roots/link -> other/, so roots/link/../sticky/c2/ceph.conf is
   * top/sticky/c2/ceph.conf (the user's), not roots/sticky/...
   */
  roots = make_dir (top, "roots", 0755, 0);
  link = join (roots, "link");
  CHECK (symlink (other_dir, link) == 0, "making %s", link);
  CHECK (asprintf (&up, "%s/../sticky/c2/ceph.conf", link) > 0, "no memory");
  refused (up, "\"..\" after root's link, into a user's directory", c2);
  free (up);
  CHECK (asprintf (&up, "%s/./../other/other.conf", link) > 0, "no memory");
  accepted (up, "\"..\" after root's link, into root's directory");
  free (up);

  /* Links leading to each other: ended, as the kernel ends them. */
  loop_a = join (roots, "a");
  loop_b = join (roots, "b");
  CHECK (symlink (loop_b, loop_a) == 0 && symlink (loop_a, loop_b) == 0,
         "making %s", loop_a);
  refused (loop_a, "a loop of links", "too many symbolic links");

  /* A link whose text is longer than a first guess at its length. */
  memset (name, 'd', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  long_dir = make_dir (other_dir, name, 0755, 0);
  free (make_conf (long_dir, "ceph.conf"));
  long_link = join (roots, "long");
  {
    char *target;

    CHECK (asprintf (&target, "%s/../%s/./../%s/ceph.conf", long_dir, name,
                     name) > 0, "no memory");
    CHECK (strlen (target) > 512, "the long link is short");
    CHECK (symlink (target, long_link) == 0, "making %s", long_link);
    free (target);
  }
  accepted (long_link, "root's link with a long text");

  refused ("sticky/c2/ceph.conf", "relative", "not an absolute path");

  free (sticky);
  free (c2);
  free (recorded);
  free (other_dir);
  free (other);
  free (roots);
  free (link);
  free (loop_a);
  free (loop_b);
  free (long_dir);
  free (long_link);
  printf ("ok: each server walks its configuration's path again\n");
  return 0;
}
