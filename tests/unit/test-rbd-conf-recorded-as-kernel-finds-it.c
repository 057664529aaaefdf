/* The Ceph configuration attach records in an RBD device's name
 * (device/store_name.c) is the file the kernel, librados and the rbd
 * tool open for the path the caller gave or $CEPH_CONF named, not
 * another: "link/../ceph.conf" with link a symbolic link goes up from
 * the link's target, not from the directory holding the link, so taking
 * ".." away from the spelling alone would record a neighbour of the
 * link, another cluster's configuration perhaps.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "store_name.h"
#include "unit.h"

static void
make_conf (const char *path, const char *mon)
{
  FILE *f = fopen (path, "w");

  CHECK (f != NULL, "%s: cannot make it", path);
  fprintf (f, "[global]\nmon_host = %s\n", mon);
  fclose (f);
  chmod (path, 0644);
}

/* The conf= NAME records, as the servers are given it. */
static const char *
recorded_conf (const char *name)
{
  const char *c = strstr (name, ":conf=");

  CHECK (c != NULL, "%s: no conf= recorded", name);
  return c + strlen (":conf=");
}

/* Whether A and B are one file. */
static bool
same_file (const char *a, const char *b)
{
  struct stat sa, sb;

  return stat (a, &sa) == 0 && stat (b, &sb) == 0 &&
    sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  g_autofree char *real = g_build_filename (dir, "cluster-a", NULL);
  g_autofree char *sub = g_build_filename (real, "sub", NULL);
  g_autofree char *top = g_build_filename (dir, "top", NULL);
  g_autofree char *link = g_build_filename (top, "link", NULL);
  g_autofree char *wanted = g_build_filename (real, "ceph.conf", NULL);
  g_autofree char *neighbour = g_build_filename (top, "ceph.conf", NULL);
  g_autofree char *spelt = g_build_filename (link, "..", "ceph.conf", NULL);
  g_autofree char *pinned = NULL, *with = NULL;
  char err[512] = "";

  CHECK (mkdir (real, 0755) == 0 && mkdir (sub, 0755) == 0 &&
         mkdir (top, 0755) == 0, "making %s's directories", dir);
  CHECK (symlink (sub, link) == 0, "%s: cannot link it", link);
  make_conf (wanted, "192.0.2.1");
  make_conf (neighbour, "192.0.2.2");

  unsetenv ("CEPH_ARGS");
  unsetenv ("CEPH_KEYRING");
  unsetenv ("CEPH_LIB");
  /* Found by the search: $CEPH_CONF names it so. */
  setenv ("CEPH_CONF", spelt, 1);
  pinned = mloop_rbd_name_pinned ("rbd:pool/img", err, sizeof err);
  CHECK (pinned != NULL, "$CEPH_CONF=%s refused: %s", spelt, err);
  CHECK (recorded_conf (pinned)[0] == '/', "%s: conf= not absolute", pinned);
  CHECK (same_file (recorded_conf (pinned), wanted),
         "$CEPH_CONF=%s, which opens %s, recorded as %s", spelt, wanted,
         pinned);

  /* Named, relative to the working directory: --ceph-conf. */
  CHECK (chdir (top) == 0, "cd %s", top);
  with = mloop_rbd_name_with ("rbd:pool/img", "link/../ceph.conf", NULL,
                              err, sizeof err);
  CHECK (with != NULL, "--ceph-conf link/../ceph.conf refused: %s", err);
  CHECK (recorded_conf (with)[0] == '/', "%s: conf= not absolute", with);
  CHECK (same_file (recorded_conf (with), wanted),
         "--ceph-conf link/../ceph.conf in %s, which opens %s, recorded as "
         "%s", top, wanted, with);
  CHECK (chdir ("/") == 0, "cd /");
  return 0;
}
