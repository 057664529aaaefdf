/* mloop — autoclear: a device that goes away when its last user closes it. */
#include <string.h>
#include <sys/stat.h>

#include <glib.h>

#include "autoclear.h"
#include "device_owner.h"
#include "errmsg.h"
#include "nbd_netlink.h"
#include "nbd_sysfs.h"

int
mloop_autoclear_enable (struct mloop_device_state *s, char *err,
                        size_t errlen)
{
  char why[512];

  if (s->transport == MLOOP_TRANSPORT_UBLK)
    return mloop_fail (err, errlen, "/dev/ublkb%d: autoclear is not "
                       "supported for ublk devices yet", s->index);
  if (mloop_nbd_netlink_disconnect_on_close (s->index,
                                             mloop_state_backend (s), why,
                                             sizeof why) < 0)
    return mloop_fail (err, errlen, "/dev/nbd%d: autoclear: %s", s->index,
                       why);
  s->autoclear = true;
  return mloop_state_save (s, err, errlen);
}

/* The real kernel's answers (mloop_autoclear_kernel). */
static int
kernel_connected (int index)
{
  bool connected = true;
  char why[512];

  if (mloop_nbd_netlink_connected (index, &connected, why, sizeof why) < 0)
    return -1;
  return connected;
}

static char *
kernel_backend (int index)
{
  return mloop_nbd_sysfs_backend ("/sys/block", index);
}

static uid_t
kernel_node_owner (const char *name)
{
  g_autofree char *node = g_strconcat ("/dev/", name, NULL);
  struct stat st;

  return stat (node, &st) == 0 ? st.st_uid : (uid_t) -1;
}

static bool
kernel_give_back (const char *name)
{
  char why[512];

  mloop_device_owner_set (name, 0, why, sizeof why);
  return mloop_device_owner_is_root (name);
}

const struct mloop_autoclear_kernel mloop_autoclear_kernel_now = {
  .connected = kernel_connected,
  .backend = kernel_backend,
  .running = mloop_nbd_sysfs_started,
  .device_of = mloop_state_nbd_device_of,
  .node_owner = kernel_node_owner,
  .give_back = kernel_give_back,
};

bool
mloop_autoclear_finished (const struct mloop_device_state *s,
                          const struct mloop_autoclear_kernel *k)
{
  g_autofree char *name = mloop_state_device_name (s);
  int connected = k->connected (s->index);

  if (connected != 0) {
    /* Not done while S's own image is there, or a descriptor is open
     * on the idle device (configured, not started, no backend).
     */
    g_autofree char *backend = k->backend (s->index);

    if (backend && *backend) {
      if (strcmp (backend, mloop_state_backend (s)) == 0)
        return false;
      /* Another image there by now.  An mloop attach gave the node
       * back to root before connecting, and then to its own owner; a
       * tool that names a backend (a netlink connect of its own) left
       * it as S left it.  So the node, if still S's owner's, goes back
       * unless another mloop device there is theirs.  The node is read
       * first: an attach saves its state before giving its node away.
       */
      return s->owner == 0 || k->node_owner (name) != s->owner ||
        k->device_of (s->index, backend, s->owner) || k->give_back (name);
    }
    if (connected < 0 || !k->running (s->index))
      return false;
    /* Started with no backend (or an empty one: a netlink connect that
     * named none): another tool's device, since every mloop connect
     * names its backend.  Its node, if still S's owner's, goes back to
     * root, or S's user would open that device.
     */
    return s->owner == 0 || k->node_owner (name) != s->owner ||
      k->give_back (name);
  }
  if (s->owner == 0 || s->transport == MLOOP_TRANSPORT_UBLK)
    return true;
  /* Root's first, then asked again: opened in between, the device is
   * its user's still, and counts as theirs until they close it.  A node
   * that could not be given back stays counted too: asked again at the
   * next look.
   */
  return k->give_back (name) && k->connected (s->index) == 0;
}
