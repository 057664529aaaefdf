/* An autoclear device's index taken, once the kernel let it go, by
 * another tool's device, one connected with no backend identifier
 * (`qemu-nbd -c`; `nbd-client` in netlink mode, which the kernel shows
 * as an empty one), or with one of its own that no mloop device of the
 * user's there names, finishes its state and gives its user's node back
 * to root.  Every mloop connect names its backend, so
 * a started device without one is not the state's.  With no backend it
 * was taken for a descriptor open on the idle device: the supervisor
 * waited for as long as that device lasted, the node stayed the user's
 * (0600), so they could read and write root's device, and the
 * supervisor, listening for dead connections at its index, would have
 * handed its own server's sockets to root's device.  With an empty one
 * or a name of its own it was taken for another mloop image, whose
 * attach gives the node back first: the state finished, the node left
 * the user's.  The user's own new mloop device there keeps its node.
 *
 * The kernel is simulated (autoclear.h's seam).  No root, no NBD: about
 * 0.001 s, in the unit suite of every tier.
 */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "autoclear.h"
#include "unit.h"

#define INDEX 7
#define USER_UID 1000
#define OTHER_UID 2000

/* The simulated device at INDEX and its node. */
static struct {
  bool configured;      /* connected, or held open */
  bool running;         /* started by a connect (sysfs "pid") */
  char *backend;        /* the configuration's backend, NULL for none */
  uid_t node_owner;
  bool users_device_there;      /* a saved mloop state of USER_UID's */
  bool give_back_fails;
  unsigned give_backs;
} dev;

static int
sim_connected (int index)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return dev.configured;
}

static char *
sim_backend (int index)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return dev.configured ? g_strdup (dev.backend) : NULL;
}

static bool
sim_running (int index)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return dev.configured && dev.running;
}

static bool
sim_device_of (int index, const char *backend, uid_t owner)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  CHECK (backend != NULL && dev.backend != NULL &&
         strcmp (backend, dev.backend) == 0,
         "asked about backend %s, not the one shown", backend);
  return owner == USER_UID && dev.users_device_there;
}

static uid_t
sim_node_owner (const char *name)
{
  CHECK (strcmp (name, "nbd7") == 0, "asked about %s", name);
  return dev.node_owner;
}

static bool
sim_give_back (const char *name)
{
  CHECK (strcmp (name, "nbd7") == 0, "gave back %s", name);
  dev.give_backs++;
  if (dev.give_back_fails)
    return false;
  dev.node_owner = 0;
  return true;
}

static const struct mloop_autoclear_kernel sim = {
  .connected = sim_connected, .backend = sim_backend,
  .running = sim_running, .device_of = sim_device_of,
  .node_owner = sim_node_owner,
  .give_back = sim_give_back,
};

/* The kernel let the user's device go, and some other tool's device,
 * RUNNING or only opened, is at its index with no backend; the node
 * is NODE_OWNER's.
 */
static void
other_there (bool running, uid_t node_owner)
{
  dev.configured = true;
  dev.running = running;
  g_clear_pointer (&dev.backend, g_free);
  dev.node_owner = node_owner;
  dev.users_device_there = false;
  dev.give_back_fails = false;
  dev.give_backs = 0;
}

int
main (void)
{
  struct mloop_device_state s = {
    .transport = MLOOP_TRANSPORT_NBD, .index = INDEX,
    .file = "held:3c0e1d7a-8b4f-4d52-a1f0-6e2b9c7d5a13", .held_image = true,
    .owner = USER_UID, .autoclear = true,
  };

  /* Root's device connected there with no backend, the node still the
   * user's: finished, and the node root's.
   */
  other_there (true, USER_UID);
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with another tool's device at its index");
  CHECK (dev.give_backs == 1 && dev.node_owner == 0,
         "the user's node left on another tool's device (owner %u)",
         (unsigned) dev.node_owner);
  /* Looked at again under the lock: still finished, nothing more done. */
  CHECK (mloop_autoclear_finished (&s, &sim), "not finished the second time");
  CHECK (dev.give_backs == 1, "gave back a node that was root's");

  /* The same with a netlink connect that named no backend: the kernel
   * shows an empty one.
   */
  other_there (true, USER_UID);
  dev.backend = g_strdup ("");
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with another tool's device (empty backend) there");
  CHECK (dev.give_backs == 1 && dev.node_owner == 0,
         "the user's node left on another tool's device (empty backend)");

  /* Another tool's netlink connect naming a backend of its own, which
   * no mloop device there names: the node goes back.
   */
  other_there (true, USER_UID);
  dev.backend = g_strdup ("root-export");
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with another tool's named device there");
  CHECK (dev.give_backs == 1 && dev.node_owner == 0,
         "the user's node left on another tool's named device");

  /* The user's own new mloop device there, whose attach gave them the
   * node: finished, the node theirs still.
   */
  other_there (true, USER_UID);
  dev.backend = g_strdup ("/home/user/b.img");
  dev.users_device_there = true;
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with the user's new device there");
  CHECK (dev.give_backs == 0 && dev.node_owner == USER_UID,
         "took the node of the user's new device there");

  /* The node no longer the user's (given to someone since): finished,
   * and the node left as it is.
   */
  other_there (true, OTHER_UID);
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with another tool's device at its index");
  CHECK (dev.give_backs == 0 && dev.node_owner == OTHER_UID,
         "took a node that was not the user's any more");

  /* The node could not be given back: asked again at the next look. */
  other_there (true, USER_UID);
  dev.give_back_fails = true;
  CHECK (!mloop_autoclear_finished (&s, &sim),
         "finished with the user's node left on another tool's device");
  dev.give_back_fails = false;
  CHECK (mloop_autoclear_finished (&s, &sim), "not finished once given back");
  CHECK (dev.node_owner == 0, "the node is still the user's");

  /* Configured but not started: a descriptor open on the idle device,
   * the user's own perhaps, which keeps it counted until closed.
   */
  other_there (false, USER_UID);
  CHECK (!mloop_autoclear_finished (&s, &sim),
         "finished while a descriptor is open on the idle device");

  /* Root's own state: finished, no node to give back. */
  s.owner = 0;
  other_there (true, 0);
  CHECK (mloop_autoclear_finished (&s, &sim),
         "root's state not finished with another tool's device there");
  CHECK (dev.give_backs == 0, "gave back root's own node");

  g_free (dev.backend);
  printf ("ok: another tool's device at a released autoclear device's "
          "index finishes it, its node root's\n");
  return 0;
}
