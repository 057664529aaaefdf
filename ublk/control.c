/* The ublk control device.  Every command is one IORING_OP_URING_CMD on
 * /dev/ublk-control whose 32-byte payload (struct ublksrv_ctrl_cmd) sits
 * in the SQE itself, hence a ring of 128-byte SQEs; the kernel's answer is
 * the CQE's result. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "control.h"

#define CONTROL_PATH "/dev/ublk-control"

int
ublk_ctrl_open (struct ublk_ctrl *c, bool legacy)
{
  memset (c, 0, sizeof *c);
  c->legacy = legacy;
  c->info.dev_id = -1;
  c->fd = open (CONTROL_PATH, O_RDWR | O_CLOEXEC);
  if (c->fd < 0)
    return -errno;
  int r = io_uring_queue_init (4, &c->ring, IORING_SETUP_SQE128);
  if (r < 0) {
    close (c->fd);
    c->fd = -1;
  }
  return r;
}

void
ublk_ctrl_close (struct ublk_ctrl *c)
{
  if (c->fd >= 0) {
    io_uring_queue_exit (&c->ring);
    close (c->fd);
    c->fd = -1;
  }
}

/* One command, waited for (at most TIMEOUT_MS, 0: forever; then
 * -ETIMEDOUT, and the command stays with the kernel until the ring is
 * closed).  ENCODED is the _IOWR form, LEGACY the bare number of 6.1. */
static int
ctrl_cmd_wait (struct ublk_ctrl *c, unsigned encoded, unsigned legacy,
               void *buf, unsigned len, __u64 data0, unsigned timeout_ms)
{
  struct ublksrv_ctrl_cmd cmd = {
    .dev_id = c->info.dev_id,
    .queue_id = (__u16) -1,     /* not a per-queue command */
    .len = len,
    .addr = (__u64) (uintptr_t) buf,
    .data = { data0 },
  };
  struct io_uring_sqe *sqe = io_uring_get_sqe (&c->ring);
  if (!sqe)
    return -EBUSY;
  ublk_prep_cmd (sqe, c->fd, c->legacy ? legacy : encoded, &cmd, sizeof cmd, 0);
  int r = io_uring_submit (&c->ring);
  if (r < 0)
    return r;
  struct io_uring_cqe *cqe;
  struct __kernel_timespec ts = {
    .tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000L,
  };
  do
    r = timeout_ms ? io_uring_wait_cqe_timeout (&c->ring, &cqe, &ts)
        : io_uring_wait_cqe (&c->ring, &cqe);
  while (r == -EINTR);
  if (r == -ETIME)
    return -ETIMEDOUT;
  if (r < 0)
    return r;
  r = cqe->res;
  io_uring_cqe_seen (&c->ring, cqe);
  return r < 0 ? r : 0;
}

static int
ctrl_cmd (struct ublk_ctrl *c, unsigned encoded, unsigned legacy,
          void *buf, unsigned len, __u64 data0)
{
  return ctrl_cmd_wait (c, encoded, legacy, buf, len, data0, 0);
}

int
ublk_ctrl_get_info (struct ublk_ctrl *c, unsigned id)
{
  c->info.dev_id = id;
  int r = ctrl_cmd (c, UBLK_U_CMD_GET_DEV_INFO, UBLK_CMD_GET_DEV_INFO,
                    &c->info, sizeof c->info, 0);
  c->info.dev_id = id;          /* whatever the kernel wrote on failure */
  return r;
}

int
ublk_ctrl_add (struct ublk_ctrl *c, int id, unsigned nr_queues,
               unsigned depth, unsigned max_io_bytes, bool recovery)
{
  c->info = (struct ublksrv_ctrl_dev_info) {
    .nr_hw_queues = nr_queues,
    .queue_depth = depth,
    .max_io_buf_bytes = max_io_bytes,
    /* The kernel insists that the header's id and this one agree; -1
     * asks it to choose. */
    .dev_id = (__u32) id,
    .flags = UBLK_F_CMD_IOCTL_ENCODE
             /* REISSUE: requests the dead server had taken are handed
              * to the next one (a write may land twice: harmless on an
              * image) instead of failing. */
             | (recovery ? UBLK_F_USER_RECOVERY | UBLK_F_USER_RECOVERY_REISSUE : 0),
  };
  /* ADD_DEV writes the device's info, its id included, back into INFO. */
  return ctrl_cmd (c, UBLK_U_CMD_ADD_DEV, UBLK_CMD_ADD_DEV,
                   &c->info, sizeof c->info, 0);
}

int
ublk_ctrl_get_params (struct ublk_ctrl *c, struct ublk_params *p)
{
  memset (p, 0, sizeof *p);
  p->len = sizeof *p;           /* how much we can take */
  return ctrl_cmd (c, UBLK_U_CMD_GET_PARAMS, UBLK_CMD_GET_PARAMS, p, sizeof *p, 0);
}

int
ublk_ctrl_start_recovery (struct ublk_ctrl *c)
{
  return ctrl_cmd (c, UBLK_U_CMD_START_USER_RECOVERY,
                   UBLK_CMD_START_USER_RECOVERY, NULL, 0, 0);
}

int
ublk_ctrl_end_recovery (struct ublk_ctrl *c)
{
  /* data[0]: the new serving process, as for START_DEV. */
  return ctrl_cmd (c, UBLK_U_CMD_END_USER_RECOVERY, UBLK_CMD_END_USER_RECOVERY,
                   NULL, 0, getpid ());
}

int
ublk_ctrl_set_params (struct ublk_ctrl *c, uint64_t size_bytes,
                      unsigned lbs_shift, unsigned pbs_shift, bool read_only,
                      uint32_t max_discard_bytes)
{
  struct ublk_params p = {
    /* The 6.1 layout; newer kernels take a shorter struct by its len. */
    .len = sizeof p,
    .types = UBLK_PARAM_TYPE_BASIC,
    .basic = {
      /* A write cache we flush with fdatasync, and FUA by RWF_DSYNC:
       * the kernel then sends FLUSH and FUA instead of assuming every
       * completed write is durable. */
      .attrs = UBLK_ATTR_VOLATILE_CACHE | UBLK_ATTR_FUA
               | (read_only ? UBLK_ATTR_READ_ONLY : 0),
      .logical_bs_shift = lbs_shift,
      .physical_bs_shift = pbs_shift,
      .io_min_shift = pbs_shift,
      .io_opt_shift = pbs_shift,
      .max_sectors = c->info.max_io_buf_bytes >> 9,
      .dev_sectors = size_bytes >> 9,
    },
  };
  /* The engine trims and zeroes any block-aligned range (partial blocks
   * by read-modify-write): the kernel may send DISCARD and WRITE_ZEROES
   * of any multiple of the logical block size, one range at a time. */
  if (max_discard_bytes) {
    p.types |= UBLK_PARAM_TYPE_DISCARD;
    p.discard = (struct ublk_param_discard) {
      .discard_granularity = 1u << lbs_shift,
      .max_discard_sectors = max_discard_bytes >> 9,
      .max_write_zeroes_sectors = max_discard_bytes >> 9,
      .max_discard_segments = 1,
    };
  }
  return ctrl_cmd (c, UBLK_U_CMD_SET_PARAMS, UBLK_CMD_SET_PARAMS, &p, sizeof p, 0);
}

int
ublk_ctrl_start (struct ublk_ctrl *c)
{
  /* data[0]: the serving process; the kernel checks it against the
   * process that fetched the tags. */
  return ctrl_cmd (c, UBLK_U_CMD_START_DEV, UBLK_CMD_START_DEV, NULL, 0, getpid ());
}

int
ublk_ctrl_stop (struct ublk_ctrl *c)
{
  return ctrl_cmd (c, UBLK_U_CMD_STOP_DEV, UBLK_CMD_STOP_DEV, NULL, 0, 0);
}

int
ublk_ctrl_del (struct ublk_ctrl *c, unsigned timeout_ms)
{
  return ctrl_cmd_wait (c, UBLK_U_CMD_DEL_DEV, UBLK_CMD_DEL_DEV, NULL, 0, 0,
                        timeout_ms);
}
