/* What mloop_handshake() hands to transmission: nothing negotiated gives
 * the all-false session (simple replies, as for the kernel client);
 * STRUCTURED_REPLY gives structured replies; base:allocation is enabled
 * only when the last SET_META_CONTEXT selected it for the name that GO
 * (or EXPORT_NAME) then enters, and only with structured replies
 * negotiated first; a later SET that selects nothing, or fails, drops it.
 */
#include <stdio.h>
#include <string.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

/* SET_META_CONTEXT for NAME with one QUERY (none when NULL). */
static void
put_set (struct bytes *b, const char *name, const char *query)
{
  uint32_t n = (uint32_t) strlen (name);
  uint32_t q = query ? (uint32_t) strlen (query) : 0;

  put_option_header (b, NBD_OPT_SET_META_CONTEXT,
                     4 + n + 4 + (query ? 4 + q : 0));
  put_be (b, n, 4);
  put_data (b, name, n);
  put_be (b, query ? 1 : 0, 4);
  if (query) {
    put_be (b, q, 4);
    put_data (b, query, q);
  }
}

/* Runs a client that sends STRUCTURED_REPLY if SR, a SET for SET_NAME
 * with QUERY if SET_NAME, then GO (or EXPORT_NAME) for GO_NAME, against
 * export X; returns the session it got.
 */
static struct session
run (const struct export_info *x, bool sr, const char *set_name,
     const char *query, bool export_name, const char *go_name,
     const char *what)
{
  struct bytes client = { 0 }, answer = { 0 };

  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES, 4);
  if (sr)
    put_option (&client, NBD_OPT_STRUCTURED_REPLY, NULL, 0);
  if (set_name)
    put_set (&client, set_name, query);
  if (export_name)
    put_option (&client, NBD_OPT_EXPORT_NAME, go_name,
                (uint32_t) strlen (go_name));
  else
    put_go (&client, NBD_OPT_GO, go_name);
  handshake (x, &client, &answer, 0, what);
  bytes_free (&client);
  bytes_free (&answer);
  return handshake_session;
}

#define EXPECT(s, sr, ba, what) \
  CHECK ((s).structured_replies == (sr) && (s).base_allocation == (ba), \
         "%s: structured %d, base:allocation %d; expected %d, %d", (what), \
         (s).structured_replies, (s).base_allocation, (sr), (ba))

int
main (void)
{
  struct export_info any = plain_disk;
  struct session s;
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;
  uint32_t len;
  const uint8_t *p;

  any.name = NULL;

  s = run (&plain_disk, false, NULL, NULL, false, "disk", "plain GO");
  EXPECT (s, false, false, "plain GO");
  s = run (&plain_disk, false, NULL, NULL, true, "disk", "EXPORT_NAME");
  EXPECT (s, false, false, "EXPORT_NAME");
  s = run (&plain_disk, true, NULL, NULL, false, "disk", "SR, GO");
  EXPECT (s, true, false, "SR, GO");
  s = run (&plain_disk, true, "disk", "base:allocation", false, "disk",
           "SR, SET, GO");
  EXPECT (s, true, true, "SR, SET, GO");
  s = run (&plain_disk, true, "disk", "base:allocation", true, "disk",
           "SR, SET, EXPORT_NAME");
  EXPECT (s, true, true, "SR, SET, EXPORT_NAME");
  s = run (&plain_disk, false, "disk", "base:allocation", false, "disk",
           "SET without SR");
  EXPECT (s, false, false, "SET without SR");
  s = run (&plain_disk, true, "disk", "base:", false, "disk",
           "SET base: (ignored)");
  EXPECT (s, true, false, "SET base:");
  s = run (&plain_disk, true, "disk", NULL, false, "disk", "SET nothing");
  EXPECT (s, true, false, "SET nothing");
  s = run (&any, true, "a", "base:allocation", false, "b",
           "SET for a, GO b");
  EXPECT (s, true, false, "SET for a, GO b");
  s = run (&any, true, "a", "base:allocation", false, "a",
           "SET for a, GO a");
  EXPECT (s, true, true, "SET for a, GO a");

  /* A SET that selects, then one that fails (another export): dropped.
   * The replies: ACK, META_CONTEXT with a nonzero id and ACK, UNKNOWN.
   */
  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  put_option (&client, NBD_OPT_STRUCTURED_REPLY, NULL, 0);
  put_set (&client, "disk", "base:allocation");
  put_set (&client, "other", "base:allocation");
  put_go (&client, NBD_OPT_GO, "disk");
  r = handshake (&plain_disk, &client, &answer, 0, "SET, failed SET, GO");
  expect_reply (&r, NBD_OPT_STRUCTURED_REPLY, NBD_REP_ACK, &len);
  p = expect_reply (&r, NBD_OPT_SET_META_CONTEXT, NBD_REP_META_CONTEXT, &len);
  CHECK (len == 4 + 15 && memcmp (p + 4, "base:allocation", 15) == 0 &&
         (p[0] | p[1] | p[2] | p[3]) != 0, "META_CONTEXT reply");
  expect_reply (&r, NBD_OPT_SET_META_CONTEXT, NBD_REP_ACK, &len);
  expect_reply (&r, NBD_OPT_SET_META_CONTEXT, NBD_REP_ERR_UNKNOWN, &len);
  expect_go_accepted (&r);
  EXPECT (handshake_session, true, false, "SET, failed SET, GO");

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: the session follows STRUCTURED_REPLY and SET_META_CONTEXT\n");
  return 0;
}
