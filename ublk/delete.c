/* Deleting a device whose server is gone (killed, crashed).  Without
 * user recovery the kernel takes the disk away when the server's
 * io_uring goes (/dev/ublkbN disappears), but the ublk device itself,
 * /dev/ublkcN and its id, stays until someone sends DEL_DEV (see
 * docs/design.md, "The ublk transport").  With user recovery
 * (--recovery) the disk stays too, quiesced, its IO held; DEL_DEV fails
 * that IO and removes both.  `mloop detach` calls this after a SIGKILL. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "control.h"
#include "delete.h"

/* DEL_DEV waits for /dev/ublkcN to be closed: a server still running
 * (or stuck in the kernel) would hold us forever. */
#define DELETE_TIMEOUT_MS 10000

int
ublk_delete_device (unsigned id, bool legacy, char *err, size_t errlen)
{
  struct ublk_ctrl ctrl;
  int r = ublk_ctrl_open (&ctrl, legacy);
  if (r < 0) {
    snprintf (err, errlen, "/dev/ublk-control: %s (is ublk_drv loaded?)",
              strerror (-r));
    return -1;
  }
  r = ublk_ctrl_get_info (&ctrl, id);
  if (r == -ENODEV) {           /* gone already */
    ublk_ctrl_close (&ctrl);
    return 0;
  }
  if (r < 0) {
    snprintf (err, errlen, "ublk device %u: GET_DEV_INFO: %s", id, strerror (-r));
    goto fail;
  }
  int pid = ctrl.info.ublksrv_pid;
  /* A live disk (its server still running, or one that never noticed
   * its server went) is stopped first: its queues' fetches are aborted,
   * and a running mloop-ublk then takes its device down itself. */
  if (ctrl.info.state == UBLK_S_DEV_LIVE) {
    r = ublk_ctrl_stop (&ctrl);
    if (r < 0 && r != -ENODEV) {
      snprintf (err, errlen, "ublk device %u: STOP_DEV: %s", id, strerror (-r));
      goto fail;
    }
  }
  r = ublk_ctrl_del (&ctrl, DELETE_TIMEOUT_MS);
  if (r == -ETIMEDOUT) {
    /* DEL_DEV waits for both ends to be let go: the server's char
     * device, and every opener of the disk. */
    snprintf (err, errlen, "ublk device %u: still in use after %d s "
              "(/dev/ublkc%u by its server, pid %d, or /dev/ublkb%u by an "
              "opener)", id, DELETE_TIMEOUT_MS / 1000, id, pid, id);
    goto fail;
  }
  if (r < 0 && r != -ENODEV) {
    snprintf (err, errlen, "ublk device %u: DEL_DEV: %s", id, strerror (-r));
    goto fail;
  }
  ublk_ctrl_close (&ctrl);
  return 0;
fail:
  ublk_ctrl_close (&ctrl);
  return -1;
}
