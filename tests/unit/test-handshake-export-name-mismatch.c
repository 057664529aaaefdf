/* NBD_OPT_EXPORT_NAME for a name the server does not serve closes the
 * connection with no answer at all: the option has no error reply.  For
 * the served name the answer is the size and flags, followed by 124
 * zero bytes unless the client agreed to NBD_FLAG_C_NO_ZEROES.
 */
#include <stdio.h>
#include <string.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

static const struct export_info disk = {
  .size = UINT64_C (0xfedcba987600),
  .transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_READ_ONLY,
  .min_block = 512, .preferred_block = 4096, .max_block = 32u << 20,
  .name = "disk",
};

/* The client's bytes: EXPORT_NAME for NAME (LEN bytes), then a GO that
 * must not be read as another option.
 */
static void
export_name (struct bytes *client, uint32_t client_flags, const char *name,
             uint32_t len)
{
  client->len = 0;
  put_be (client, client_flags, 4);
  put_option (client, NBD_OPT_EXPORT_NAME, name, len);
  put_go (client, NBD_OPT_GO, "disk");
}

int
main (void)
{
  /* Near misses: a prefix, a longer name, case, a terminating NUL. */
  static const struct { const char *name; uint32_t len; } wrong[] = {
    { "", 0 }, { "dis", 3 }, { "disk ", 5 }, { "DISK", 4 }, { "disk", 5 },
  };
  struct bytes client = { 0 }, answer = { 0 };
  struct reader r;

  for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
    export_name (&client, NBD_FLAG_C_FIXED_NEWSTYLE, wrong[i].name,
                 wrong[i].len);
    r = handshake (&disk, &client, &answer, -1, "EXPORT_NAME, a wrong name");
    CHECK (r.left == 0, "EXPORT_NAME \"%.*s\" (%u bytes) was answered",
           (int) wrong[i].len, wrong[i].name, wrong[i].len);
  }

  /* The right name, with and without the zeroes. */
  for (int no_zeroes = 0; no_zeroes <= 1; no_zeroes++) {
    export_name (&client, NBD_FLAG_C_FIXED_NEWSTYLE |
                 (no_zeroes ? NBD_FLAG_C_NO_ZEROES : 0), "disk", 4);
    r = handshake (&disk, &client, &answer, 0, "EXPORT_NAME disk");
    CHECK (get_be (&r, 8) == disk.size, "%s: size", r.what);
    CHECK (get_be (&r, 2) == disk.transmission_flags, "%s: flags", r.what);
    if (!no_zeroes)
      for (int i = 0; i < 124; i++)
        CHECK (get_be (&r, 1) == 0, "%s: zero byte %d", r.what, i);
    expect_end (&r);
  }

  bytes_free (&client);
  bytes_free (&answer);
  printf ("ok: EXPORT_NAME closes for a wrong name, answers the right one\n");
  return 0;
}
