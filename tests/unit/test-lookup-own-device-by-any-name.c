/* A lookup by a file's name (mloop detach, status, mount FILE) finds
 * the device of that file whatever name of it is given, as attach
 * refuses it under any name (device and inode: a hard link, a bind
 * mount), and the asker's own before another user's.  Another user's
 * read-only device of an image passed to mloop-dbus refuses no attach
 * of root's, so both serve one file: looked up by the state's name for
 * root's device and by identity for the user's, `mloop detach LINK`
 * found only the user's, and root detached it in place of its own, which
 * went on writing the file.
 *
 * The devices are states made up in a private runtime directory: no
 * root, no NBD, about 0.001 s, in the unit suite of every tier.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "device_state.h"
#include "lookup_fixture.h"
#include "unit.h"

int
main (void)
{
  const char *tmp = unit_tmpdir ("/tmp");
  g_autofree char *run = g_build_filename (tmp, "run", NULL);
  g_autofree char *img = g_build_filename (tmp, "disk.img", NULL);
  g_autofree char *alias = g_build_filename (tmp, "other-name.img", NULL);
  g_autofree char *real = NULL;
  g_autofree char *mine = NULL, *theirs = NULL;
  const uid_t me = geteuid ();
  struct stat st;

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  unit_make_image (img, 1 << 20);
  CHECK (link (img, alias) == 0, "link %s: %m", alias);
  CHECK (stat (img, &st) == 0, "stat %s: %m", img);
  real = realpath (img, NULL);
  CHECK (real != NULL, "realpath %s: %m", img);

  /* This process's device of the file, attached by its first name. */
  mine = unit_make_device (1, real, &st, me, false, false);
  unit_expect_lookup (img, 1);
  unit_expect_lookup (alias, 1);

  /* Another user's read-only device of it, passed as a descriptor and
   * listed first: the asker's own is still the one found, by either
   * name.
   */
  theirs = unit_make_device (0, "held:4e1a0c4e-0000-4000-8000-000000000000",
                             &st, me + 1, true, true);
  unit_expect_lookup (img, 1);
  unit_expect_lookup (alias, 1);

  /* Without one of the asker's, the other user's (detach then asks
   * org.mloop.detach-other).
   */
  mloop_state_remove (mine);
  unit_expect_lookup (img, 0);
  unit_expect_lookup (alias, 0);

  mloop_state_remove (theirs);
  unlink (alias);
  unlink (img);
  return 0;
}
