/* mloop — the request queue settings of an attached /dev/nbdN.
 *
 * The kernel's NBD client creates its devices tuned for nothing in
 * particular: mq-deadline (chosen while the device had one hardware
 * queue), 128 KiB requests at most, 128 requests per queue.  Attach sets
 * the values docs/design.md "Queue settings" argues for, then the user's
 * --queue-option NAME=VALUE, each a file of /sys/block/nbdN/queue.  The
 * settings belong to the device, not the connection: they outlive a
 * reconnect, and the next user of /dev/nbdN inherits them.
 */
#ifndef MLOOP_BLOCK_QUEUE_H
#define MLOOP_BLOCK_QUEUE_H

#include <stddef.h>
#include <stdint.h>

/* The largest request mloop lets the kernel build (max_sectors_kb): a
 * 1 MiB read is one NBD request, not eight.
 */
#define MLOOP_QUEUE_MAX_REQUEST_KB 1024
/* Read-ahead for buffered readers of the device, as the loop driver's. */
#define MLOOP_QUEUE_READ_AHEAD_KB 128

struct mloop_queue_plan {
  unsigned depth;               /* nr_requests: requests per connection */
  uint32_t server_max_request;  /* the export's largest request, 0: any */
  /* "NAME=VALUE" settings applied after mloop's own, in order; NULL or
   * NULL-terminated.
   */
  char *const *options;
};

/* Checks that every OPTIONS entry is NAME=VALUE with NAME a plain file
 * name.  Before anything is started, so a typo costs nothing.
 */
int mloop_queue_options_check (char *const *options, char *err,
                               size_t errlen);

/* Applies P to the nbd device DEV ("nbd3"): scheduler none, then the
 * depth (switching scheduler resets nr_requests), the request size and
 * read-ahead, then the user's options.  Fails naming the setting and the
 * kernel's reason.
 */
int mloop_queue_configure (const char *dev, const struct mloop_queue_plan *p,
                           char *err, size_t errlen);

/* Applies only the user's OPTIONS (checked) to DEV ("ublkb0"): a ublk
 * device comes tuned by its own parameters.
 */
int mloop_queue_apply_options (const char *dev, char *const *options,
                               char *err, size_t errlen);

#endif /* MLOOP_BLOCK_QUEUE_H */
