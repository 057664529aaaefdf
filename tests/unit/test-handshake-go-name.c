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

/* Sizes and flags no default would produce. */
static const struct export_info disk = {
  .size = UINT64_C (0x123456789a),
  .transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH |
    NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM,
  .min_block = 1024, .preferred_block = 8192, .max_block = 16u << 20,
  .name = "disk",
};

/* The INFO replies and the ACK that accept a GO for X, and the end. */
static void
expect_export (struct reader *r, const struct export_info *x)
{
  struct reader info = { .what = r->what };
  uint32_t len;

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
  expect_end (r);
}

/* The client's bytes: flags, then a GO for each name in NAMES. */
static void
go (struct bytes *client, uint32_t flags, const char *const *names)
{
  client->len = 0;
  put_be (client, flags, 4);
  for (; *names; names++)
    put_go (client, NBD_OPT_GO, *names);
}

int
main (void)
{
  struct export_info any = disk;
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;
  uint32_t len;

  /* The served name: straight into transmission. */
  go (&client, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES,
      (const char *[]) { "disk", NULL });
  r = handshake (&disk, &client, &answer, 0, "GO disk");
  expect_export (&r, &disk);

  /* Other names first: refused, the connection stays; then ours. */
  go (&client, NBD_FLAG_C_FIXED_NEWSTYLE,
      (const char *[]) { "dis", "disk2", "disk", NULL });
  r = handshake (&disk, &client, &answer, 0, "GO dis, disk2, disk");
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_export (&r, &disk);

  /* Only a wrong name: the client gives up, and so does the server. */
  go (&client, NBD_FLAG_C_FIXED_NEWSTYLE, (const char *[]) { "", NULL });
  r = handshake (&disk, &client, &answer, -1, "GO \"\"");
  expect_reply (&r, NBD_OPT_GO, NBD_REP_ERR_UNKNOWN, &len);
  expect_end (&r);

  /* A server with no name serves whatever the client asks for. */
  any.name = NULL;
  go (&client, NBD_FLAG_C_FIXED_NEWSTYLE, (const char *[]) { "anything", NULL });
  r = handshake (&any, &client, &answer, 0, "GO anything, any name");
  expect_export (&r, &any);

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: GO enters transmission for the served name only\n");
  return 0;
}
