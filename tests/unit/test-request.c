/* Unit tests for request decoding and validation (server/request.c): the
 * decisions mloop-server makes on a request before any IO, one table row
 * each.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "nbd_proto.h"
#include "request.h"

#define MiB (1024u * 1024)
#define BAD 0xffff                      /* an unknown command */

static const struct request_limits rw = {
  .size = 10 * MiB, .read_only = false, .discard = true, .max_request = 32 * MiB,
};
static const struct request_limits ro = {
  .size = 10 * MiB, .read_only = true, .discard = true, .max_request = 32 * MiB,
};
static const struct request_limits nodiscard = {
  .size = 10 * MiB, .read_only = false, .discard = false, .max_request = 32 * MiB,
};
/* base:allocation negotiated: BLOCK_STATUS allowed (read-only too). */
static const struct request_limits meta = {
  .size = 10 * MiB, .read_only = true, .discard = false, .max_request = 32 * MiB,
  .block_status = true,
};
/* Structured replies negotiated: READ may carry DF. */
static const struct request_limits structured = {
  .size = 10 * MiB, .read_only = false, .discard = true, .max_request = 32 * MiB,
  .structured_replies = true,
};

struct row {
  const struct request_limits *x;
  uint16_t type, flags;
  uint64_t offset;
  uint32_t length;
  enum request_verdict admit;           /* request_admit() */
  enum request_verdict check;           /* request_check(), if admitted */
  uint32_t error;                       /* with REQUEST_REPLY */
};

static const struct row rows[] = {
  /* READ */
  { &rw, NBD_CMD_READ, 0, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_READ, NBD_CMD_FLAG_FUA, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_READ, NBD_CMD_FLAG_NO_HOLE, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, NBD_CMD_READ, 0, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, NBD_CMD_READ, 0, 10 * MiB - 1, 1, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_READ, 0, 10 * MiB - 1, 2, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, NBD_CMD_READ, 0, UINT64_MAX, 2, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, NBD_CMD_READ, 0, 0, 32 * MiB, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, NBD_CMD_READ, 0, 0, 32 * MiB + 1, REQUEST_REPLY, REQUEST_REPLY, NBD_EINVAL },
  { &ro, NBD_CMD_READ, 0, 0, 512, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &structured, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_READ, NBD_CMD_FLAG_DF, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &structured, NBD_CMD_WRITE, NBD_CMD_FLAG_DF, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  /* WRITE */
  { &rw, NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_WRITE, NBD_CMD_FLAG_FAST_ZERO, 0, 1, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &ro, NBD_CMD_WRITE, 0, 0, 1, REQUEST_PROCEED, REQUEST_REPLY, NBD_EPERM },
  { &ro, NBD_CMD_WRITE, 0, 20 * MiB, 1, REQUEST_PROCEED, REQUEST_REPLY, NBD_EPERM },
  { &rw, NBD_CMD_WRITE, 0, 10 * MiB, 1, REQUEST_PROCEED, REQUEST_REPLY, NBD_ENOSPC },
  { &rw, NBD_CMD_WRITE, 0, UINT64_MAX - 1, 4, REQUEST_PROCEED, REQUEST_REPLY, NBD_ENOSPC },
  { &rw, NBD_CMD_WRITE, 0, 10 * MiB, 0, REQUEST_PROCEED, REQUEST_REPLY, 0 },
  { &rw, NBD_CMD_WRITE, 0, 10 * MiB + 1, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_ENOSPC },
  { &rw, NBD_CMD_WRITE, 0, 0, 32 * MiB + 1, REQUEST_CLOSE, 0, 0 },
  /* FLUSH */
  { &rw, NBD_CMD_FLUSH, 0, 0, 0, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_FLUSH, 0, UINT64_MAX, UINT32_MAX, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_FLUSH, NBD_CMD_FLAG_NO_HOLE, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &ro, NBD_CMD_FLUSH, 0, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, 0 },
  /* TRIM: the range is the engine's to check */
  { &rw, NBD_CMD_TRIM, NBD_CMD_FLAG_FUA, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_TRIM, 0, 0, UINT32_MAX, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_TRIM, NBD_CMD_FLAG_NO_HOLE, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &ro, NBD_CMD_TRIM, 0, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EPERM },
  { &nodiscard, NBD_CMD_TRIM, 0, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  /* WRITE_ZEROES */
  { &rw, NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE |
    NBD_CMD_FLAG_FAST_ZERO, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &rw, NBD_CMD_WRITE_ZEROES, 1u << 2, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &ro, NBD_CMD_WRITE_ZEROES, 0, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EPERM },
  { &nodiscard, NBD_CMD_WRITE_ZEROES, 0, 0, UINT32_MAX, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  /* DISC and the unknown */
  { &rw, NBD_CMD_DISC, 0, 0, 0, REQUEST_CLOSE, 0, 0 },
  { &rw, 5, 0, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },   /* CACHE */
  /* BLOCK_STATUS: only with a context; inside, non-empty, REQ_ONE the
   * only flag; a length beyond max_request is fine (a hint). */
  { &rw, NBD_CMD_BLOCK_STATUS, 0, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &meta, NBD_CMD_BLOCK_STATUS, 0, 0, 4096, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &meta, NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_REQ_ONE, 0, 10 * MiB, REQUEST_PROCEED, REQUEST_PROCEED, 0 },
  { &meta, NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_FUA, 0, 4096, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &meta, NBD_CMD_BLOCK_STATUS, 0, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &meta, NBD_CMD_BLOCK_STATUS, 0, 10 * MiB - 512, 1024, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &meta, NBD_CMD_BLOCK_STATUS, 0, UINT64_MAX, 1, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, BAD, 0, 0, 0, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
  { &rw, BAD, 0, 0, UINT32_MAX, REQUEST_PROCEED, REQUEST_REPLY, NBD_EINVAL },
};

static void
encode (unsigned char *w, uint32_t magic, uint16_t flags, uint16_t type,
        uint64_t cookie, uint64_t offset, uint32_t length)
{
  int i;

  for (i = 0; i < 4; i++) w[i] = (unsigned char) (magic >> (24 - 8 * i));
  w[4] = (unsigned char) (flags >> 8); w[5] = (unsigned char) flags;
  w[6] = (unsigned char) (type >> 8); w[7] = (unsigned char) type;
  for (i = 0; i < 8; i++) w[8 + i] = (unsigned char) (cookie >> (56 - 8 * i));
  for (i = 0; i < 8; i++) w[16 + i] = (unsigned char) (offset >> (56 - 8 * i));
  for (i = 0; i < 4; i++) w[24 + i] = (unsigned char) (length >> (24 - 8 * i));
}

int
main (void)
{
  unsigned char wire[NBD_REQUEST_SIZE + 3];
  struct nbd_request r;
  uint32_t error;
  size_t i;

  /* Decoding: every field big-endian, the cookie as is, from any
   * alignment (the header can sit anywhere in the input buffer).
   */
  encode (wire + 3, NBD_REQUEST_MAGIC, 0x1234, 0x5678,
          UINT64_C (0x0102030405060708), UINT64_C (0x1122334455667788),
          0x9abcdef0);
  request_decode (wire + 3, &r);
  assert (r.magic == NBD_REQUEST_MAGIC);
  assert (r.flags == 0x1234 && r.type == 0x5678);
  assert (memcmp (r.cookie, "\x01\x02\x03\x04\x05\x06\x07\x08", 8) == 0);
  assert (r.offset == UINT64_C (0x1122334455667788));
  assert (r.length == 0x9abcdef0);

  /* A bad magic closes, whatever the rest says. */
  encode (wire, NBD_REQUEST_MAGIC ^ 1, 0, NBD_CMD_READ, 0, 0, 512);
  request_decode (wire, &r);
  error = 99;
  assert (request_admit (&r, &rw, &error) == REQUEST_CLOSE);

  for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    const struct row *t = &rows[i];
    enum request_verdict v;

    encode (wire, NBD_REQUEST_MAGIC, t->flags, t->type, i, t->offset,
            t->length);
    request_decode (wire, &r);
    error = 99;
    v = request_admit (&r, t->x, &error);
    if (v != t->admit) {
      fprintf (stderr, "row %zu: admit gave %d, expected %d\n", i, v, t->admit);
      return 1;
    }
    if (v == REQUEST_CLOSE)
      continue;
    if (v == REQUEST_REPLY) {
      /* Refused at admission: must agree with the row's error. */
      if (error != t->error) {
        fprintf (stderr, "row %zu: admit error %u, expected %u\n", i, error,
                 t->error);
        return 1;
      }
      continue;
    }
    assert (error == 0);
    error = 99;
    v = request_check (&r, t->x, &error);
    if (v != t->check || (v == REQUEST_REPLY && error != t->error) ||
        (v == REQUEST_PROCEED && error != 0)) {
      fprintf (stderr, "row %zu: check gave %d/%u, expected %d/%u\n", i, v,
               error, t->check, t->error);
      return 1;
    }
  }

  printf ("ok: %zu request decisions\n", sizeof rows / sizeof rows[0]);
  return 0;
}
