/* NBD_OPT_ABORT is acknowledged and ends the handshake: the server sends
 * the ACK and nothing else, and closes.  The spec has the server ignore
 * any data the client sent with it, even more than an option may carry.
 */
#include <stdio.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

/* ABORT with LEN bytes of data after a LIST, then a GO the server must
 * not answer.
 */
static void
abort_with (uint32_t len, const char *what)
{
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;
  uint32_t rlen;

  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_option (&client, NBD_OPT_LIST, NULL, 0);
  put_option (&client, NBD_OPT_ABORT, NULL, len);
  put_go (&client, NBD_OPT_GO, "disk");

  r = handshake (&plain_disk, &client, &answer, -1, what);
  expect_reply (&r, NBD_OPT_LIST, NBD_REP_SERVER, &rlen);
  expect_reply (&r, NBD_OPT_LIST, NBD_REP_ACK, &rlen);
  expect_reply (&r, NBD_OPT_ABORT, NBD_REP_ACK, &rlen);
  CHECK (rlen == 0, "%s: ACK with %u bytes", what, rlen);
  expect_end (&r);              /* the GO after it went unanswered */
  bytes_free (&client);
  bytes_free (&answer);
}

int
main (void)
{
  abort_with (0, "ABORT");
  abort_with (16, "ABORT with data");
  abort_with (64 * 1024, "ABORT with 64 KiB of data");
  printf ("ok: ABORT acked and the handshake ends\n");
  return 0;
}
