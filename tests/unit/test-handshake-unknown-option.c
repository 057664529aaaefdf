/* An option mloop does not implement (TLS, extended headers, numbers
 * nobody has assigned) is answered NBD_REP_ERR_UNSUP, its payload
 * consumed, and negotiation goes on: the client can still GO.
 */
#include <stdio.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

static const uint32_t unknown[] = {
  NBD_OPT_STARTTLS,
  11,                           /* NBD_OPT_EXTENDED_HEADERS */
  0,                            /* never assigned */
  0x12345678,
  UINT32_MAX,
};
#define N_UNKNOWN (sizeof unknown / sizeof unknown[0])

int
main (void)
{
  struct bytes client = { 0 }, answer = { 0 };
  const char payload[] = "payload the server must skip";
  struct reader r;
  uint32_t len;

  put_be (&client, NBD_FLAG_C_FIXED_NEWSTYLE, 4);
  for (size_t i = 0; i < N_UNKNOWN; i++)
    /* Every other one with a payload: its bytes must not be taken for
     * the next option header.
     */
    put_option (&client, unknown[i], i % 2 ? payload : NULL,
                i % 2 ? sizeof payload : 0);
  put_go (&client, NBD_OPT_GO, "disk");

  r = handshake (&plain_disk, &client, &answer, 0, "unknown options, GO");
  for (size_t i = 0; i < N_UNKNOWN; i++) {
    expect_reply (&r, unknown[i], NBD_REP_ERR_UNSUP, &len);
    CHECK (len <= NBD_MAX_STRING, "option %u: error message of %u bytes",
           unknown[i], len);
  }
  expect_go_accepted (&r);

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: %zu unknown options answered ERR_UNSUP, then GO\n", N_UNKNOWN);
  return 0;
}
