/* Every attach names its device to the kernel with a backend identifier
 * of its own, though root may attach one file more than once (windows
 * of it with --offset and --sizelimit, overlays over it).  The
 * identifier was the file itself: a stale autoclear state of one
 * window, its index given since to another window of the same file,
 * took that device for its own.  Its supervisor then never finished it
 * and, when one of the other device's connections died, offered its
 * own server's sockets (the same size passes the kernel's check): that
 * device would have served the stale state's window, and its writes
 * landed there; its detach would have disconnected the other device,
 * its resize resized it.
 *
 * No root, no NBD (autoclear.h's seam, and a sysfs copy for the
 * reconfigure check): about 0.01 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "autoclear.h"
#include "nbd_netlink.h"
#include "unit.h"

#define INDEX 4
#define IMAGE "/var/lib/images/disk.img"

static char *shown;                    /* the backend the kernel shows */

static int
sim_connected (int index)
{
  return 1;
}

static char *
sim_backend (int index)
{
  return g_strdup (shown);
}

static bool
sim_running (int index)
{
  return true;
}

static bool
sim_device_of (int index, const char *backend, uid_t owner)
{
  return false;
}

static uid_t
sim_node_owner (const char *name)
{
  return 0;
}

static bool
sim_give_back (const char *name)
{
  return true;
}

static const struct mloop_autoclear_kernel sim = {
  .connected = sim_connected, .backend = sim_backend,
  .running = sim_running, .device_of = sim_device_of,
  .node_owner = sim_node_owner, .give_back = sim_give_back,
};

int
main (void)
{
  g_autofree char *first = mloop_state_new_backend (IMAGE);
  g_autofree char *second = mloop_state_new_backend (IMAGE);
  g_autofree char *held = mloop_state_held_token ();
  g_autofree char *held_backend = mloop_state_new_backend (held);
  g_autofree char *long_name = g_strnfill (4090, 'x');
  g_autofree char *long_backend = NULL;
  const char *dir = unit_tmpdir ("/var/tmp");
  g_autofree char *nbd = g_strdup_printf ("%s/nbd%d", dir, INDEX);
  g_autofree char *file = g_build_filename (nbd, "backend", NULL);
  struct mloop_device_state a = {
    .transport = MLOOP_TRANSPORT_NBD, .index = INDEX, .file = IMAGE,
    .backend = first, .autoclear = true,
  };
  struct mloop_device_state old = a;
  char err[512];

  long_name[0] = '/';
  long_backend = mloop_state_new_backend (long_name);
  CHECK (strcmp (first, second) != 0, "two attaches of %s are both %s",
         IMAGE, first);
  CHECK (g_str_has_prefix (first, IMAGE "#"), "%s does not name %s", first,
         IMAGE);
  CHECK (strcmp (held_backend, held) == 0, "a held image's token %s became %s",
         held, held_backend);
  CHECK (strlen (long_backend) < 4000, "a %zu-byte backend would be cut "
         "in sysfs's page", strlen (long_backend));

  /* A's device went; the other window's device is at its index now. */
  shown = g_strdup (second);
  CHECK (mloop_autoclear_finished (&a, &sim),
         "A's state took the other attach's device of %s for its own",
         IMAGE);
  /* A's own, still there: not finished. */
  g_free (shown);
  shown = g_strdup (first);
  CHECK (!mloop_autoclear_finished (&a, &sim), "A's own device taken for "
         "another's");
  /* A state written before identifiers were its own: the file. */
  old.backend = NULL;
  g_free (shown);
  shown = g_strdup (IMAGE);
  CHECK (!mloop_autoclear_finished (&old, &sim), "an older state's device "
         "(backend: its file) taken for another's");

  /* A reconfigure for A (a heal, a resize) is refused on the other's. */
  CHECK (g_mkdir_with_parents (nbd, 0755) == 0, "mkdir %s", nbd);
  CHECK (g_file_set_contents (file, second, -1, NULL), "write %s", file);
  CHECK (mloop_nbd_backend_check_at (dir, INDEX, first, err, sizeof err) ==
         -ESTALE, "A's reconfigure would reach the other attach's device");
  CHECK (g_file_set_contents (file, first, -1, NULL), "write %s", file);
  CHECK (mloop_nbd_backend_check_at (dir, INDEX, first, err, sizeof err) ==
         0, "A's reconfigure refused on its own device: %s", err);
  g_free (shown);
  printf ("ok: each attach names its device with an identifier of its own\n");
  return 0;
}
