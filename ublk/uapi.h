/* What Debian 12's <linux/ublk_cmd.h> (Linux 6.1) and liburing 2.3 lack
 * for ublk, in one place.
 *
 * Linux 6.1 knows only the "legacy" command numbers (a bare 0x04 for
 * ADD_DEV ...).  Later kernels want the numbers encoded as ioctls,
 * _IOWR('u', NR, payload), and accept the bare ones only when built with
 * CONFIG_BLKDEV_UBLK_LEGACY_OPCODES (Debian's 6.12 has it, but it is
 * marked for removal).  We always send the encoded form; the bare
 * numbers stay available for probing (mloop-ublk --legacy-opcodes). */
#ifndef MLOOP_UBLK_UAPI_H
#define MLOOP_UBLK_UAPI_H

#include <linux/ublk_cmd.h>
#include <liburing.h>
#include <string.h>
#include <sys/ioctl.h>

#ifndef UBLK_U_CMD_ADD_DEV
#define UBLK_U_CMD_GET_DEV_INFO     _IOR('u', UBLK_CMD_GET_DEV_INFO, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_ADD_DEV          _IOWR('u', UBLK_CMD_ADD_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_DEL_DEV          _IOWR('u', UBLK_CMD_DEL_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_START_DEV        _IOWR('u', UBLK_CMD_START_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_STOP_DEV         _IOWR('u', UBLK_CMD_STOP_DEV, struct ublksrv_ctrl_cmd)
#define UBLK_U_CMD_SET_PARAMS       _IOWR('u', UBLK_CMD_SET_PARAMS, struct ublksrv_ctrl_cmd)
#define UBLK_U_IO_FETCH_REQ         _IOWR('u', UBLK_IO_FETCH_REQ, struct ublksrv_io_cmd)
#define UBLK_U_IO_COMMIT_AND_FETCH_REQ _IOWR('u', UBLK_IO_COMMIT_AND_FETCH_REQ, struct ublksrv_io_cmd)
#endif
/* User recovery (mloop-ublk --recovery / --recover N): 6.1 has the bare
 * numbers and the flags, not these encoded forms. */
#ifndef UBLK_U_CMD_GET_PARAMS
#define UBLK_U_CMD_GET_PARAMS       _IOR('u', UBLK_CMD_GET_PARAMS, struct ublksrv_ctrl_cmd)
#endif
#ifndef UBLK_U_CMD_START_USER_RECOVERY
#define UBLK_U_CMD_START_USER_RECOVERY _IOWR('u', UBLK_CMD_START_USER_RECOVERY, struct ublksrv_ctrl_cmd)
#endif
#ifndef UBLK_U_CMD_END_USER_RECOVERY
#define UBLK_U_CMD_END_USER_RECOVERY _IOWR('u', UBLK_CMD_END_USER_RECOVERY, struct ublksrv_ctrl_cmd)
#endif

/* Feature bit (6.x): the driver takes ioctl-encoded command numbers.
 * Reported back by ADD_DEV in dev_info.flags. */
#ifndef UBLK_F_CMD_IOCTL_ENCODE
#define UBLK_F_CMD_IOCTL_ENCODE (1ULL << 6)
#endif

/* The character device of ublk device N and its block device. */
#define UBLK_CHAR_PATH "/dev/ublkc%d"
#define UBLK_BLOCK_PATH "/dev/ublkb%d"

/* An IORING_OP_URING_CMD on FD with command CMD_OP and payload LEN bytes
 * from PAYLOAD (at most 80: the ring must be IORING_SETUP_SQE128).
 * liburing 2.3 has no io_uring_prep_uring_cmd. */
static inline void
ublk_prep_cmd (struct io_uring_sqe *sqe, int fd, unsigned cmd_op,
               const void *payload, size_t len, __u64 user_data)
{
  memset (sqe, 0, 2 * sizeof *sqe);     /* an SQE128 slot is two SQEs wide */
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = fd;
  sqe->cmd_op = cmd_op;
  memcpy (sqe->cmd, payload, len);
  sqe->user_data = user_data;
}

#endif
