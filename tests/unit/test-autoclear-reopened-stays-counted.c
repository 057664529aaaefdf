/* An autoclear device its user opens again after the kernel let it go
 * is not forgotten while they hold it.  The kernel gives an idle nbd
 * device opened through its node a configuration again, and keeps it
 * (refusing to connect another image there) until the descriptor
 * closes.  A user's node stays theirs until the supervisor gives it
 * back, so a user who opens it in the moment between the supervisor's
 * look at the kernel and the give-back held a device whose state the
 * supervisor then removed: uncounted by mloop-dbus's cap (it counts the
 * state), their node still theirs, and as many such devices as they
 * cared to attach.  mloop_autoclear_finished gives the node back before
 * it looks the last time.
 *
 * The kernel is simulated (autoclear.h's seam): a user who opens the
 * device at the worst moment, right after each look, whenever the node
 * is theirs.  No root, no NBD: about 0.001 s, in the unit suite of
 * every tier.
 */
#include <stdio.h>
#include <string.h>

#include <glib.h>

#include "autoclear.h"
#include "unit.h"

#define INDEX 5
#define USER_UID 1000

/* The simulated device and its user. */
static struct {
  bool configured;      /* connected, or held open by the user */
  char *backend;        /* the configuration's backend, NULL for none */
  bool node_users;      /* its node is the user's */
  bool user_races;      /* the user opens it whenever the node is theirs */
  unsigned give_backs;
} dev;

static int
sim_connected (int index)
{
  bool was = dev.configured;

  CHECK (index == INDEX, "asked about nbd%d", index);
  /* Right after the look: the user opens the idle device, which the
   * kernel configures again, with no backend.
   */
  if (dev.user_races && dev.node_users && !dev.configured) {
    dev.configured = true;
    g_clear_pointer (&dev.backend, g_free);
  }
  return was;
}

static char *
sim_backend (int index)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return dev.configured ? g_strdup (dev.backend) : NULL;
}

/* Never started: only the user's descriptor configures it again. */
static bool
sim_running (int index)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return false;
}

/* No other mloop device is ever at its index here. */
static bool
sim_device_of (int index, const char *backend, uid_t owner)
{
  CHECK (index == INDEX, "asked about nbd%d", index);
  return false;
}

static uid_t
sim_node_owner (const char *name)
{
  CHECK (strcmp (name, "nbd5") == 0, "asked about %s", name);
  return dev.node_users ? USER_UID : 0;
}

static bool
sim_give_back (const char *name)
{
  CHECK (strcmp (name, "nbd5") == 0, "gave back %s", name);
  dev.node_users = false;
  dev.give_backs++;
  return true;
}

static const struct mloop_autoclear_kernel sim = {
  .connected = sim_connected, .backend = sim_backend,
  .running = sim_running, .device_of = sim_device_of,
  .node_owner = sim_node_owner, .give_back = sim_give_back,
};

/* The kernel let the user's device go (its last close). */
static void
released_by_kernel (bool user_races)
{
  dev.configured = false;
  g_clear_pointer (&dev.backend, g_free);
  dev.node_users = true;
  dev.user_races = user_races;
  dev.give_backs = 0;
}

int
main (void)
{
  struct mloop_device_state s = {
    .transport = MLOOP_TRANSPORT_NBD, .index = INDEX,
    .file = "held:0b5f7a52-5a27-4a43-9a8e-0f2c3c1e7d11", .held_image = true,
    .owner = USER_UID, .autoclear = true,
  };
  bool finished;

  /* Attached: not finished, nothing given back. */
  dev.configured = true;
  dev.backend = g_strdup (s.file);
  dev.node_users = true;
  CHECK (!mloop_autoclear_finished (&s, &sim), "finished while attached");
  CHECK (dev.give_backs == 0 && dev.node_users,
         "the node was taken from an attached device");

  /* Released, and the user opens it again at once: whatever the
   * supervisor decides, it never forgets a device its user holds.
   */
  released_by_kernel (true);
  for (int tick = 0; tick < 4; tick++) {
    finished = mloop_autoclear_finished (&s, &sim);
    CHECK (!(finished && dev.configured),
           "tick %d: finished while the user holds the device (its node "
           "%s)", tick, dev.node_users ? "still theirs" : "root's");
  }
  CHECK (!dev.node_users, "the node is still the user's");

  /* They close it: finished, and the node, root's, stays so. */
  dev.configured = false;
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished once the user closed the device");
  CHECK (!dev.node_users && !dev.configured, "left to the user");

  /* Released with no one racing: finished at the first look. */
  released_by_kernel (false);
  CHECK (mloop_autoclear_finished (&s, &sim), "an idle device not finished");
  CHECK (dev.give_backs == 1 && !dev.node_users, "the node not given back");

  /* Another mloop image connected there since, whose attach gave the
   * node back to root first: finished, and its node (its own attach's
   * business) untouched.
   */
  released_by_kernel (false);
  dev.node_users = false;
  dev.configured = true;
  dev.backend = g_strdup ("/var/lib/images/other.img");
  CHECK (mloop_autoclear_finished (&s, &sim),
         "not finished with another image connected there");
  CHECK (dev.give_backs == 0, "took the node of another image's device");

  /* Root's own device: nothing to give back. */
  s.owner = 0;
  released_by_kernel (false);
  CHECK (mloop_autoclear_finished (&s, &sim), "root's device not finished");
  CHECK (dev.give_backs == 0, "gave back root's own node");

  g_free (dev.backend);
  printf ("ok: a released autoclear device its user reopens stays theirs "
          "and counted\n");
  return 0;
}
