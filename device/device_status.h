/* mloop — how an attached device is doing, for `mloop status`.
 *
 * Gathers the kernel's view (connected, hardware queues) and the server's
 * (alive, its request counters from stats.h).  Never prints.
 */
#ifndef MLOOP_DEVICE_STATUS_H
#define MLOOP_DEVICE_STATUS_H

#include <stdbool.h>

#include "device_state.h"
#include "stats.h"

struct mloop_device_status {
  bool server_running;
  bool supervisor_running;      /* its pid is alive, on this device's dir */
  bool kernel_connected;
  unsigned hardware_queues;     /* entries in /sys/block/nbdN/mq */
  bool have_stats;
  struct mloop_stats stats;     /* a snapshot of the server's counters */
};

void mloop_device_status_read (const struct mloop_device_state *s,
                               struct mloop_device_status *out);

#endif /* MLOOP_DEVICE_STATUS_H */
