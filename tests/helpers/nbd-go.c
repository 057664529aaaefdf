/* Test helper: negotiates with the library's NBD client handshake
 * (nbd/nbd_client.c) on a Unix socket, then proves the connection is in
 * transmission by reading the first block, and prints what it learnt as
 * JSON.  Usage: nbd-go SOCKET [EXPORT]
 */
#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "nbd_client.h"
#include "nbd_proto.h"

static int
read_first_block (int fd, uint32_t len)
{
  struct {
    uint32_t magic;
    uint16_t flags, type;
    uint64_t cookie, offset;
    uint32_t len;
  } __attribute__((packed)) req = {
    htobe32 (NBD_REQUEST_MAGIC), 0, htobe16 (NBD_CMD_READ),
    htobe64 (42), 0, htobe32 (len)
  };
  struct {
    uint32_t magic, error;
    uint64_t cookie;
  } __attribute__((packed)) rep;
  char buf[4096];

  if (send (fd, &req, sizeof req, 0) != sizeof req ||
      recv (fd, &rep, sizeof rep, MSG_WAITALL) != sizeof rep ||
      be32toh (rep.magic) != NBD_SIMPLE_REPLY_MAGIC || rep.error != 0 ||
      be64toh (rep.cookie) != 42 ||
      recv (fd, buf, len, MSG_WAITALL) != (ssize_t) len)
    return -1;
  return 0;
}

int
main (int argc, char *argv[])
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  struct mloop_nbd_export x;
  char err[256];
  int fd;
  uint32_t len;

  if (argc < 2 || strlen (argv[1]) >= sizeof sun.sun_path) {
    fprintf (stderr, "usage: nbd-go SOCKET [EXPORT]\n");
    return 2;
  }
  strcpy (sun.sun_path, argv[1]);
  fd = socket (AF_UNIX, SOCK_STREAM, 0);
  if (fd == -1 || connect (fd, (struct sockaddr *) &sun, sizeof sun) == -1) {
    perror (argv[1]);
    return 1;
  }
  if (mloop_nbd_client_go (fd, argc > 2 ? argv[2] : "", &x, err,
                           sizeof err) == -1) {
    fprintf (stderr, "nbd-go: %s\n", err);
    return 1;
  }
  len = x.min_block ? x.min_block : 512;
  printf ("{\"size\": %" PRIu64 ", \"flags\": %u, \"min\": %u, "
          "\"preferred\": %u, \"max\": %u, \"read_ok\": %s}\n",
          x.size, x.flags, x.min_block, x.preferred_block, x.max_block,
          len <= 4096 && read_first_block (fd, len) == 0 ? "true" : "false");
  close (fd);
  return 0;
}
