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

#include "attach.h"
#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

/* A device's state for FILE, identity ST, in the runtime directory. */
static char *
make_device (int index, const char *file, const struct stat *st,
             uid_t owner)
{
  struct mloop_device_state s = {
    .index = index, .file = (char *) file, .size = 1 << 20,
    .file_dev = st->st_dev, .file_ino = st->st_ino,
    .owner = owner, .person = owner,
    .block_size = 512, .connections = 1, .threads = 1,
    .server = mloop_server_kind_default (),
  };
  char err[256];

  CHECK (mloop_state_create (&s, err, sizeof err) == 0, "create: %s", err);
  CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);
  return s.dir;
}

/* Looks WHAT up as the CLI does, expecting device INDEX. */
static void
expect (const char *what, int index)
{
  struct mloop_device_state st;
  char err[512];

  CHECK (mloop_lookup (what, &st, err, sizeof err) == 0,
         "%s: %s", what, err);
  CHECK (st.index == index, "%s: found nbd%d, expected nbd%d", what,
         st.index, index);
  mloop_state_clear (&st);
}

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

  first = make_device (0, real, &was, me);
  second = make_device (1, real, &now, me);
  expect (img, 1);
  expect (moved, 0);

  mloop_state_remove (first);
  mloop_state_remove (second);
  unlink (moved);
  unlink (img);
  return 0;
}
