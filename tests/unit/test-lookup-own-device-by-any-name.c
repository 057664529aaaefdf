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

#include "attach.h"
#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

/* A device's state for FILE, identity ST, in the runtime directory. */
static char *
make_device (int index, const char *file, const struct stat *st,
             uid_t owner, bool held, bool read_only)
{
  struct mloop_device_state s = {
    .index = index, .file = (char *) file, .size = 1 << 20,
    .file_dev = st->st_dev, .file_ino = st->st_ino,
    .held_image = held, .label = held ? (char *) "/home/user/mine.img"
    : NULL, .owner = owner, .person = owner, .read_only = read_only,
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
  CHECK (st.index == index, "%s: found nbd%d (owner %u), expected nbd%d",
         what, st.index, (unsigned) st.owner, index);
  mloop_state_clear (&st);
}

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
  mine = make_device (1, real, &st, me, false, false);
  expect (img, 1);
  expect (alias, 1);

  /* Another user's read-only device of it, passed as a descriptor and
   * listed first: the asker's own is still the one found, by either
   * name.
   */
  theirs = make_device (0, "held:4e1a0c4e-0000-4000-8000-000000000000", &st,
                        me + 1, true, true);
  expect (img, 1);
  expect (alias, 1);

  /* Without one of the asker's, the other user's (detach then asks
   * org.mloop.detach-other).
   */
  mloop_state_remove (mine);
  expect (img, 0);
  expect (alias, 0);

  mloop_state_remove (theirs);
  unlink (alias);
  unlink (img);
  return 0;
}
