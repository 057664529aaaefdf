/* Test helper: what the kernel does with a connection offered to a
 * device that has no dead one.  Negotiates one connection to the export
 * on a Unix socket (device/nbd_connect.c), clears its send timeout, hands
 * it to /dev/nbdINDEX with NBD_CMD_RECONFIGURE (device/nbd_netlink.c),
 * and prints as JSON the kernel's answer (0 or -errno) and the socket's
 * send timeout afterwards, which the kernel sets to the request timeout
 * on a socket it takes (drivers/block/nbd.c, nbd_reconnect_socket): the
 * supervisor tells a taken socket from a dropped one by it.
 *
 * Usage: nbd-offer SOCKET INDEX BACKEND
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "nbd_connect.h"
#include "nbd_netlink.h"

int
main (int argc, char **argv)
{
  struct mloop_nbd_export x;
  struct timeval tv = { 0 };
  socklen_t len = sizeof tv;
  char err[512];
  int fd, rc;

  if (argc != 4) {
    fprintf (stderr, "usage: nbd-offer SOCKET INDEX BACKEND\n");
    return 2;
  }
  if (mloop_nbd_connect_unix (argv[1], 1, &fd, &x, err, sizeof err) == -1) {
    fprintf (stderr, "nbd-offer: %s\n", err);
    return 1;
  }
  if (setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == -1) {
    perror ("nbd-offer: setsockopt");
    return 1;
  }
  rc = mloop_nbd_netlink_reconfigure (atoi (argv[2]), argv[3], &fd, 1, 0,
                                      err, sizeof err);
  if (getsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &len) == -1) {
    perror ("nbd-offer: getsockopt");
    return 1;
  }
  close (fd);
  printf ("{\"reconfigure\": %d, \"error\": \"%s\", \"send_timeout\": %.3f}\n",
          rc, rc < 0 ? err : "", tv.tv_sec + tv.tv_usec / 1e6);
  return 0;
}
