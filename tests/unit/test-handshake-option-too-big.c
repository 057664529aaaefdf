/* An option longer than mloop reads is refused with NBD_REP_ERR_TOO_BIG
 * and its payload skipped, so the next option is read from the right
 * place and negotiation goes on.  One declaring more than the server
 * will even skip (over 1 MiB), or an oversize NBD_OPT_EXPORT_NAME (which
 * has no error reply), closes the connection unanswered.  The longest
 * legitimate GO, a name of NBD_MAX_STRING bytes, is not too big.
 */
#include <stdio.h>
#include <string.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

/* The client's bytes: OPTION declaring LEN bytes of payload, then a GO
 * for NAME and one for our export.  The payload is sent when it fits the
 * socket buffer, else only the header: a server that tried to skip it
 * would then take the GOs for payload, and end at EOF, unanswered all
 * the same.
 */
static void
option_then_go (struct bytes *client, uint32_t option, uint32_t len,
                const char *name)
{
  client->len = 0;
  put_be (client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  if (len <= 64 * 1024)
    put_option (client, option, NULL, len);
  else
    put_option_header (client, option, len);
  put_go (client, NBD_OPT_GO, name);
  put_go (client, NBD_OPT_GO, "disk");
}

int
main (void)
{
  const uint32_t options[] = { NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST, 0x4242 };
  struct bytes client = { 0 }, answer = { 0 };
  char name[NBD_MAX_STRING + 1];
  struct reader r;
  uint32_t len;

  /* 64 KiB: too big, skipped, and then the GOs are read and answered. */
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
    option_then_go (&client, options[i], 64 * 1024, "other");
    r = handshake (&plain_disk, &client, &answer, 0, "64 KiB option");
    expect_reply (&r, options[i], NBD_REP_ERR_TOO_BIG, &len);
    expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
    expect_go_accepted (&r);
  }

  /* More than 1 MiB: not even skipped; the GOs after it go unanswered. */
  option_then_go (&client, NBD_OPT_GO, (1u << 20) + 1, "disk");
  r = handshake (&plain_disk, &client, &answer, -1, "option over 1 MiB");
  expect_end (&r);

  /* EXPORT_NAME has no error reply: too long a name closes. */
  option_then_go (&client, NBD_OPT_EXPORT_NAME, 64 * 1024, "disk");
  r = handshake (&plain_disk, &client, &answer, -1, "EXPORT_NAME of 64 KiB");
  expect_end (&r);

  /* The longest name the protocol allows fits: not ours, so UNKNOWN. */
  memset (name, 'x', NBD_MAX_STRING);
  name[NBD_MAX_STRING] = '\0';
  option_then_go (&client, NBD_OPT_LIST, 0, name);
  r = handshake (&plain_disk, &client, &answer, 0, "GO with a 4096-byte name");
  expect_reply (&r, NBD_OPT_LIST, NBD_REP_SERVER, &len);
  expect_reply (&r, NBD_OPT_LIST, NBD_REP_ACK, &len);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_go_accepted (&r);

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: oversize options refused TOO_BIG or closed\n");
  return 0;
}
