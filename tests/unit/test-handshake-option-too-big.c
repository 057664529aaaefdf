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

static const struct export_info disk = {
  .size = 1u << 20,
  .transmission_flags = NBD_FLAG_HAS_FLAGS,
  .min_block = 512, .preferred_block = 4096, .max_block = 32u << 20,
  .name = "disk",
};

/* OPTION declaring LEN bytes of payload, then a GO for our export.
 * The payload is sent when it fits the socket buffer, else only the
 * header: a server that tried to skip it would then take the GO for
 * payload, and end at EOF, unanswered all the same.
 */
static int
big_then_go (uint32_t option, uint32_t len, struct bytes *answer)
{
  struct bytes client = { 0 };
  int result;

  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  if (len <= 64 * 1024)
    put_option (&client, option, NULL, len);
  else
    put_option_header (&client, option, len);
  put_go (&client, NBD_OPT_GO, "disk");
  result = run_handshake (&disk, &client, answer);
  bytes_free (&client);
  return result;
}

static void
expect_go (struct reader *r)
{
  uint32_t len;

  expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  expect_reply (r, NBD_OPT_GO, NBD_REP_ACK, &len);
  expect_end (r);
}

int
main (void)
{
  const uint32_t options[] = { NBD_OPT_GO, NBD_OPT_INFO, NBD_OPT_LIST, 0x4242 };
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;
  uint32_t len;
  int result;

  /* 64 KiB: too big, skipped, and then the GO works. */
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
    result = big_then_go (options[i], 64 * 1024, &answer);
    r = (struct reader) { answer.data, answer.len, "64 KiB option" };
    CHECK (result == 0, "option %u of 64 KiB, then GO: handshake returned %d",
           options[i], result);
    expect_greeting (&r);
    expect_reply (&r, options[i], NBD_REP_ERR_TOO_BIG, &len);
    expect_go (&r);
  }

  /* More than 1 MiB: not even skipped; the GO after it goes unanswered. */
  result = big_then_go (NBD_OPT_GO, (1u << 20) + 1, &answer);
  r = (struct reader) { answer.data, answer.len, "option over 1 MiB" };
  CHECK (result == -1, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_end (&r);

  /* EXPORT_NAME has no error reply: too long a name closes. */
  result = big_then_go (NBD_OPT_EXPORT_NAME, 64 * 1024, &answer);
  r = (struct reader) { answer.data, answer.len, "EXPORT_NAME of 64 KiB" };
  CHECK (result == -1, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_end (&r);

  /* The longest name the protocol allows fits: not ours, so UNKNOWN. */
  char name[NBD_MAX_STRING + 1];

  memset (name, 'x', NBD_MAX_STRING);
  name[NBD_MAX_STRING] = '\0';
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_go (&client, NBD_OPT_GO, name);
  put_go (&client, NBD_OPT_GO, "disk");
  result = run_handshake (&disk, &client, &answer);
  r = (struct reader) { answer.data, answer.len, "GO with a 4096-byte name" };
  CHECK (result == 0, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_go (&r);

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: oversize options refused TOO_BIG or closed\n");
  return 0;
}
