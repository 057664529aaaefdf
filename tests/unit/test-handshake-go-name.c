/* NBD_OPT_GO enters transmission for the export's name, and only for it:
 * a wrong name gets NBD_REP_ERR_UNKNOWN and the client may try again on
 * the same connection.  A successful GO is answered with the export's
 * size and flags and its block sizes, then an ACK, and nothing after.
 * A server given no name serves any.
 */
#include <stdio.h>
#include <string.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

static const struct export_info disk = {
  .size = UINT64_C (0x123456789a),
  .transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH |
    NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM,
  .min_block = 512, .preferred_block = 4096, .max_block = 32u << 20,
  .name = "disk",
};

/* The INFO replies and the ACK that accept a GO for X. */
static void
expect_export (struct reader *r, const struct export_info *x)
{
  struct reader info;
  uint32_t len;

  info.what = r->what;
  info.p = expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  info.left = len;
  CHECK (get_be (&info, 2) == NBD_INFO_EXPORT, "%s: first INFO", r->what);
  CHECK (get_be (&info, 8) == x->size, "%s: export size", r->what);
  CHECK (get_be (&info, 2) == x->transmission_flags, "%s: flags", r->what);
  expect_end (&info);

  info.p = expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  info.left = len;
  CHECK (get_be (&info, 2) == NBD_INFO_BLOCK_SIZE, "%s: second INFO", r->what);
  CHECK (get_be (&info, 4) == x->min_block, "%s: minimum block", r->what);
  CHECK (get_be (&info, 4) == x->preferred_block, "%s: preferred block",
         r->what);
  CHECK (get_be (&info, 4) == x->max_block, "%s: maximum block", r->what);
  expect_end (&info);

  expect_reply (r, NBD_OPT_GO, NBD_REP_ACK, &len);
  CHECK (len == 0, "%s: ACK with %u bytes", r->what, len);
}

int
main (void)
{
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;
  uint32_t len;
  int result;

  /* The served name: straight into transmission. */
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES, 4);
  put_go (&client, NBD_OPT_GO, "disk");
  result = run_handshake (&disk, &client, &answer);
  r = (struct reader) { answer.data, answer.len, "GO disk" };
  CHECK (result == 0, "GO disk: handshake returned %d", result);
  expect_greeting (&r);
  expect_export (&r, &disk);
  expect_end (&r);

  /* Another name first: refused, the connection stays; then ours. */
  client.len = 0;
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_go (&client, NBD_OPT_GO, "dis");
  put_go (&client, NBD_OPT_GO, "disk2");
  put_go (&client, NBD_OPT_GO, "disk");
  result = run_handshake (&disk, &client, &answer);
  r = (struct reader) { answer.data, answer.len, "GO dis, disk2, disk" };
  CHECK (result == 0, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_export (&r, &disk);
  expect_end (&r);

  /* Only wrong names: the client gives up, and so does the server. */
  client.len = 0;
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_go (&client, NBD_OPT_GO, "");
  result = run_handshake (&disk, &client, &answer);
  r = (struct reader) { answer.data, answer.len, "GO \"\"" };
  CHECK (result == -1, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_end (&r);

  /* A server with no name serves whatever the client asks for. */
  struct export_info any = disk;

  any.name = NULL;
  client.len = 0;
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_go (&client, NBD_OPT_GO, "anything");
  result = run_handshake (&any, &client, &answer);
  r = (struct reader) { answer.data, answer.len, "GO anything, any name" };
  CHECK (result == 0, "%s: handshake returned %d", r.what, result);
  expect_greeting (&r);
  expect_export (&r, &any);
  expect_end (&r);

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: GO enters transmission for the served name only\n");
  return 0;
}
