/* mloop — how an attached device is doing, for `mloop status`. */
#include <string.h>

#include <glib.h>

#include "device_status.h"
#include "nbd_netlink.h"
#include "resident_service.h"
#include "server_process.h"
#include "ublk_device.h"

static unsigned
count_queues (const char *name)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/%s/mq", name);
  g_autoptr (GDir) d = g_dir_open (path, 0, NULL);
  unsigned n = 0;

  while (d && g_dir_read_name (d))
    n++;
  return n;
}

void
mloop_device_status_read (const struct mloop_device_state *s,
                          struct mloop_device_status *out)
{
  g_autofree char *name = mloop_state_device_name (s);
  g_autofree char *stats_file = mloop_state_path (s, MLOOP_DIR_STATS);
  const struct mloop_stats *live;
  char err[256];

  memset (out, 0, sizeof *out);
  out->supervisor_running = s->service_kept ? mloop_service_keeps (s->dir)
    : mloop_server_running (s->supervisor_pid, s->dir);
  /* Every server's command line names a file in the directory; one
   * inside mloopd serves while mloopd keeps it.
   */
  out->server_running = s->server_in_process ? out->supervisor_running
    : mloop_server_running (s->server_pid, s->dir);
  if (s->transport == MLOOP_TRANSPORT_UBLK)
    out->kernel_connected = mloop_ublk_device_present (s->index);
  else if (mloop_nbd_netlink_connected (s->index, &out->kernel_connected,
                                        err, sizeof err) < 0)
    out->kernel_connected = false;
  out->hardware_queues = count_queues (name);
  live = mloop_stats_open (stats_file);
  if (live) {
    uint64_t *dst = (uint64_t *) &out->stats;
    const uint64_t *src = (const uint64_t *) live;

    /* Counter by counter: the server keeps updating them. */
    for (size_t i = 0; i < sizeof *live / sizeof (uint64_t); i++)
      dst[i] = mloop_stats_get (&src[i]);
    out->have_stats = true;
    mloop_stats_close (live);
  }
}
