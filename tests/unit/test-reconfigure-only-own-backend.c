/* Every reconfigure mloop sends (a reconnect, a dead connection's
 * replacement, resize, autoclear) is refused unless the device shows
 * the backend given.  The kernel compares the backend identifier only
 * when the device has one, so a supervisor whose device is gone, with
 * another tool's device (connected with no backend: `nbd-client` in
 * netlink mode without -i, `qemu-nbd -c`) at its index, would hand its
 * own server's sockets to that device, or resize it.
 *
 * The check reads sysfs; here a copy of /sys/block in a temporary
 * directory.  No root, no NBD: about 0.001 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "nbd_netlink.h"
#include "unit.h"

#define IMAGE "held:7d1c2b3a-4e5f-4a6b-9c8d-0e1f2a3b4c5d"

static const char *sys_block;

/* /dev/nbdINDEX as sysfs shows it: BACKEND (NULL: no backend file). */
static void
device_shows (int index, const char *backend)
{
  g_autofree char *dir = g_strdup_printf ("%s/nbd%d", sys_block, index);
  g_autofree char *path = g_build_filename (dir, "backend", NULL);

  CHECK (g_mkdir_with_parents (dir, 0755) == 0, "mkdir %s", dir);
  if (backend == NULL)
    unlink (path);
  else
    CHECK (g_file_set_contents (path, backend, -1, NULL), "write %s", path);
}

/* Checks /dev/nbdINDEX against BACKEND: refused, with an error naming
 * the device and holding NEEDLE, or (NEEDLE NULL) let through.
 */
static void
expect (int index, const char *backend, const char *needle)
{
  char err[1024] = "";
  g_autofree char *dev = g_strdup_printf ("/dev/nbd%d", index);
  int rc = mloop_nbd_backend_check_at (sys_block, index, backend, err,
                                       sizeof err);

  if (needle == NULL) {
    CHECK (rc == 0, "%s refused for its own backend: %s", dev, err);
    return;
  }
  CHECK (rc == -ESTALE, "%s let through (%d) for backend %s", dev, rc,
         backend ? backend : "(none)");
  CHECK (strstr (err, dev) && strstr (err, needle) && !strchr (err, '\n'),
         "%s: the error does not say what is there (%s): %s", dev, needle,
         err);
}

int
main (void)
{
  sys_block = unit_tmpdir (g_get_tmp_dir ());

  /* Its own device, as the kernel shows it (a newline after). */
  device_shows (3, IMAGE "\n");
  expect (3, IMAGE, NULL);

  /* Another tool's device there, started with no backend. */
  device_shows (4, NULL);
  expect (4, IMAGE, "no backend");

  /* One a netlink connect made without naming any: an empty backend. */
  device_shows (9, "\n");
  expect (9, IMAGE, "no backend");

  /* No device at all there. */
  expect (5, IMAGE, "no backend");

  /* Another image, or a name ours begins with or that begins with
   * ours.
   */
  device_shows (6, "/var/lib/images/other.img\n");
  expect (6, IMAGE, "/var/lib/images/other.img");
  device_shows (7, IMAGE "x\n");
  expect (7, IMAGE, IMAGE "x");
  device_shows (8, "held:7d1c\n");
  expect (8, IMAGE, "held:7d1c");

  /* A name with a newline in it: still said in one line. */
  device_shows (10, "line one\nline two\n");
  expect (10, IMAGE, "line one?line two");

  /* No backend given: refused whatever is there. */
  expect (3, NULL, IMAGE);

  printf ("ok: a reconfigure goes only to the device showing its "
          "backend\n");
  return 0;
}
