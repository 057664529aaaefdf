/* A lookup by a file's name (mloop detach, resize, status, mount FILE)
 * finds the device serving the file that name leads to now, before one
 * whose state only records that name.  A file attached, then renamed
 * away and another put at its name and attached too (attach compares
 * files by identity, so both are allowed), leaves two devices recording
 * one name; looked up by it, the first listed was taken, the device of
 * the renamed file: `mloop detach FILE` took the wrong device away and
 * `mloop resize --size N FILE` truncated the renamed file.
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
  g_autofree char *moved = g_build_filename (tmp, "moved.img", NULL);
  g_autofree char *real = NULL;
  g_autofree char *first = NULL, *second = NULL;
  const uid_t me = geteuid ();
  struct stat was, now;

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  unit_make_image (img, 1 << 20);
  real = realpath (img, NULL);
  CHECK (real != NULL, "realpath %s: %m", img);
  CHECK (stat (img, &was) == 0, "stat %s: %m", img);
  /* The first device's file, renamed away while attached; another file
   * put at its name and attached as the second device.
   */
  CHECK (rename (img, moved) == 0, "rename %s: %m", img);
  unit_make_image (img, 1 << 20);
  CHECK (stat (img, &now) == 0, "stat %s: %m", img);
  CHECK (was.st_ino != now.st_ino, "the new file has the old inode");

  first = unit_make_device (0, real, &was, me, false, false);
  second = unit_make_device (1, real, &now, me, false, false);
  unit_expect_lookup (img, 1);
  unit_expect_lookup (moved, 0);

  mloop_state_remove (first);
  mloop_state_remove (second);
  unlink (moved);
  unlink (img);
  return 0;
}
