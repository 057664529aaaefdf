/* The ublk control device (/dev/ublk-control): add, configure, start,
 * stop and delete one ublk device.  Functions return 0 or a negative
 * errno. */
#ifndef MLOOP_UBLK_CONTROL_H
#define MLOOP_UBLK_CONTROL_H

#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>

#include "uapi.h"

struct ublk_ctrl {
  int fd;                       /* /dev/ublk-control */
  struct io_uring ring;         /* SQE128: the payload lives in the SQE */
  bool legacy;                  /* send 6.1's bare opcodes */
  struct ublksrv_ctrl_dev_info info;    /* as ADD_DEV returned it */
};

int ublk_ctrl_open (struct ublk_ctrl *c, bool legacy);
/* Device ID's info into c->info, and ID becomes the device the
 * commands below address (-ENODEV: no such device). */
int ublk_ctrl_get_info (struct ublk_ctrl *c, unsigned id);
void ublk_ctrl_close (struct ublk_ctrl *c);
/* A new device ID (-1: the kernel picks; -EEXIST if ID is taken) with
 * NR_QUEUES queues of DEPTH tags and requests of at most MAX_IO_BYTES;
 * its id is then in c->info.dev_id.  RECOVERY asks for user recovery
 * with reissue: when the server dies the device waits, quiesced, for
 * another to take it over (--recover). */
int ublk_ctrl_add (struct ublk_ctrl *c, int id, unsigned nr_queues,
                   unsigned depth, unsigned max_io_bytes, bool recovery);
/* The device's parameters (after ublk_ctrl_get_info) into P. */
int ublk_ctrl_get_params (struct ublk_ctrl *c, struct ublk_params *p);
/* Taking over a device whose server died: -EBUSY while the old
 * server's /dev/ublkcN is still open or the device not yet quiesced. */
int ublk_ctrl_start_recovery (struct ublk_ctrl *c);
/* Blocks, like ublk_ctrl_start, until every queue fetched every tag;
 * then the device is live again, served by us. */
int ublk_ctrl_end_recovery (struct ublk_ctrl *c);
/* The disk's size and limits; MAX_DISCARD_BYTES > 0 also offers DISCARD
 * and WRITE_ZEROES of up to that many bytes each. */
int ublk_ctrl_set_params (struct ublk_ctrl *c, uint64_t size_bytes,
                          unsigned lbs_shift, unsigned pbs_shift, bool read_only,
                          uint32_t max_discard_bytes);
/* Blocks until every queue has fetched every tag (the kernel waits for
 * that), so the queue threads must be running. */
int ublk_ctrl_start (struct ublk_ctrl *c);
int ublk_ctrl_stop (struct ublk_ctrl *c);
/* Waits until the character device is closed by everyone, at most
 * TIMEOUT_MS (0: forever; then -ETIMEDOUT). */
int ublk_ctrl_del (struct ublk_ctrl *c, unsigned timeout_ms);

#endif
