/* mloop — autoclear: a device that goes away when its last user closes it. */
#include <string.h>

#include <glib.h>

#include "autoclear.h"
#include "device_owner.h"
#include "errmsg.h"
#include "nbd_netlink.h"

int
mloop_autoclear_enable (struct mloop_device_state *s, char *err,
                        size_t errlen)
{
  char why[512];

  if (s->transport == MLOOP_TRANSPORT_UBLK)
    return mloop_fail (err, errlen, "/dev/ublkb%d: autoclear is not "
                       "supported for ublk devices yet", s->index);
  if (mloop_nbd_netlink_disconnect_on_close (s->index, s->file, why,
                                             sizeof why) < 0)
    return mloop_fail (err, errlen, "/dev/nbd%d: autoclear: %s", s->index,
                       why);
  s->autoclear = true;
  return mloop_state_save (s, err, errlen);
}

bool
mloop_autoclear_released (const struct mloop_device_state *s)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/nbd%d/backend",
                                           s->index);
  g_autofree char *backend = NULL;
  bool connected = true;
  char why[512];

  if (mloop_nbd_netlink_connected (s->index, &connected, why,
                                   sizeof why) == 0 && !connected)
    return true;
  /* The backend file exists while the device has a configuration. */
  if (!g_file_get_contents (path, &backend, NULL, NULL))
    return !connected;
  return strcmp (g_strchomp (backend), s->file) != 0;
}

void
mloop_autoclear_give_back (const struct mloop_device_state *s)
{
  g_autofree char *name = mloop_state_device_name (s);
  bool connected = true;
  char why[512];

  if (s->owner == 0 || s->transport == MLOOP_TRANSPORT_UBLK)
    return;
  if (mloop_nbd_netlink_connected (s->index, &connected, why,
                                   sizeof why) == 0 && !connected)
    mloop_device_owner_set (name, 0, why, sizeof why);
}
