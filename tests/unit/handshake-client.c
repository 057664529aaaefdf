/* A scripted NBD client for mloop_handshake().  See handshake-client.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "handshake-client.h"
#include "nbd_proto.h"
#include "unit.h"

static void
reserve (struct bytes *b, size_t n)
{
  if (b->len + n <= b->cap)
    return;
  b->cap = (b->len + n) * 2;
  b->data = realloc (b->data, b->cap);
  CHECK (b->data != NULL, "out of memory");
}

void
put_be (struct bytes *b, uint64_t v, int n)
{
  reserve (b, n);
  for (int i = n - 1; i >= 0; i--)
    b->data[b->len++] = (uint8_t) (v >> (8 * i));
}

void
put_data (struct bytes *b, const void *p, size_t n)
{
  reserve (b, n);
  if (p)
    memcpy (b->data + b->len, p, n);
  else
    memset (b->data + b->len, 0, n);
  b->len += n;
}

void
put_option_header (struct bytes *b, uint32_t option, uint32_t len)
{
  put_be (b, NBD_IHAVEOPT, 8);
  put_be (b, option, 4);
  put_be (b, len, 4);
}

void
put_option (struct bytes *b, uint32_t option, const void *data, uint32_t len)
{
  put_option_header (b, option, len);
  put_data (b, data, len);
}

void
put_go (struct bytes *b, uint32_t option, const char *name)
{
  uint32_t n = strlen (name);

  put_option_header (b, option, 4 + n + 2);
  put_be (b, n, 4);
  put_data (b, name, n);
  put_be (b, 0, 2);             /* no information requests */
}

const struct export_info plain_disk = {
  .size = 1u << 20,
  .transmission_flags = NBD_FLAG_HAS_FLAGS,
  .min_block = 512, .preferred_block = 4096, .max_block = 32u << 20,
  .name = "disk",
};

struct session handshake_session;

static int
run_handshake (const struct export_info *x, const struct bytes *client,
               struct bytes *answer)
{
  struct session session;
  int sv[2], result;
  size_t done = 0;

  CHECK (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
         "socketpair: %s", strerror (errno));
  while (done < client->len) {
    ssize_t n = send (sv[1], client->data + done, client->len - done,
                      MSG_NOSIGNAL);

    CHECK (n > 0, "sending the client's %zu bytes: %s", client->len,
           strerror (errno));
    done += (size_t) n;
  }
  CHECK (shutdown (sv[1], SHUT_WR) == 0, "shutdown: %s", strerror (errno));

  result = mloop_handshake (sv[0], x, &session);
  handshake_session = session;
  close (sv[0]);

  answer->len = 0;
  for (;;) {
    ssize_t n;

    reserve (answer, 4096);
    n = read (sv[1], answer->data + answer->len, 4096);
    /* A server that closes with the client's bytes unread resets the
     * connection, after what it sent has been read: the end as well.
     */
    if (n == 0 || (n == -1 && errno == ECONNRESET))
      break;
    CHECK (n > 0, "reading the answer: %s", strerror (errno));
    answer->len += (size_t) n;
  }
  close (sv[1]);
  return result;
}

uint64_t
get_be (struct reader *r, int n)
{
  uint64_t v = 0;

  CHECK (r->left >= (size_t) n, "%s: answer ends %zu bytes early",
         r->what, (size_t) n - r->left);
  for (int i = 0; i < n; i++)
    v = (v << 8) | r->p[i];
  r->p += n;
  r->left -= n;
  return v;
}

static void
expect_greeting (struct reader *r)
{
  uint64_t magic = get_be (r, 8), opt_magic = get_be (r, 8);
  uint16_t flags = get_be (r, 2);

  CHECK (magic == NBD_MAGIC, "%s: greeting magic %#llx", r->what,
         (unsigned long long) magic);
  CHECK (opt_magic == NBD_IHAVEOPT, "%s: option magic %#llx", r->what,
         (unsigned long long) opt_magic);
  CHECK (flags == (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES),
         "%s: handshake flags %#x", r->what, flags);
}

struct reader
handshake (const struct export_info *x, const struct bytes *client,
           struct bytes *answer, int result, const char *what)
{
  struct reader r = { .what = what };
  int got = run_handshake (x, client, answer);

  CHECK (got == result, "%s: the handshake returned %d, expected %d", what,
         got, result);
  r.p = answer->data;
  r.left = answer->len;
  expect_greeting (&r);
  return r;
}

const uint8_t *
expect_reply (struct reader *r, uint32_t option, uint32_t type,
              uint32_t *len)
{
  uint64_t magic = get_be (r, 8);
  uint32_t got_option = get_be (r, 4), got_type = get_be (r, 4);
  const uint8_t *payload;

  CHECK (magic == NBD_REP_MAGIC, "%s: reply magic %#llx", r->what,
         (unsigned long long) magic);
  CHECK (got_option == option, "%s: reply to option %u, expected %u",
         r->what, got_option, option);
  CHECK (got_type == type, "%s: reply type %#x to option %u, expected %#x",
         r->what, got_type, option, type);
  *len = get_be (r, 4);
  CHECK (r->left >= *len, "%s: reply payload of %u bytes, %zu sent",
         r->what, *len, r->left);
  payload = r->p;
  r->p += *len;
  r->left -= *len;
  return payload;
}

void
expect_end (struct reader *r)
{
  CHECK (r->left == 0, "%s: %zu bytes more than expected", r->what, r->left);
}

void
expect_go_accepted (struct reader *r)
{
  uint32_t len;

  expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  expect_reply (r, NBD_OPT_GO, NBD_REP_INFO, &len);
  expect_reply (r, NBD_OPT_GO, NBD_REP_ACK, &len);
  CHECK (len == 0, "%s: ACK with %u bytes", r->what, len);
  expect_end (r);
}

void
bytes_free (struct bytes *b)
{
  free (b->data);
  memset (b, 0, sizeof *b);
}
