/* libFuzzer target: transmission-phase request decoding and validation
 * (server/request.c), the decisions mloop-server makes on every request
 * before any IO.
 *
 * Input: one byte of export properties (bit 0 read-only, bit 1 discard,
 * bits 2-3 the max-request limit, bit 4 base:allocation negotiated, so
 * BLOCK_STATUS allowed), 8 bytes of export size (big-endian),
 * then what a client sends: 28-byte request headers, each WRITE followed
 * by its payload, as mloop-server would receive them.  Requests are
 * judged in order until the connection would close.
 *
 * Besides memory and undefined-behaviour errors, the target asserts the
 * protocol's rules (docs/fuzzing.md) independently of how request.c is
 * written: no IO outside the export or on a read-only export, no flag a
 * command does not define, the NBD error each refusal must carry.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nbd_proto.h"
#include "request.h"

static const uint32_t max_requests[4] = {
  32u << 20, 64u << 20, 4096, UINT32_MAX,
};

/* The flags each command defines (the NBD spec, as far as mloop serves). */
static bool
flags_allowed (uint16_t type, uint16_t flags, const struct request_limits *x)
{
  uint16_t ok;

  switch (type) {
  case NBD_CMD_READ:
    ok = NBD_CMD_FLAG_FUA | (x->structured_replies ? NBD_CMD_FLAG_DF : 0);
    break;
  case NBD_CMD_WRITE: case NBD_CMD_FLUSH: case NBD_CMD_TRIM:
    ok = NBD_CMD_FLAG_FUA;
    break;
  case NBD_CMD_WRITE_ZEROES:
    ok = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO;
    break;
  case NBD_CMD_BLOCK_STATUS:
    ok = NBD_CMD_FLAG_REQ_ONE;
    break;
  default:
    return false;
  }
  return (flags & ~ok) == 0;
}

/* Whether [offset, offset + length) lies inside the export, computed
 * with a wider type than request.c uses.
 */
static bool
inside (uint64_t offset, uint32_t length, uint64_t size)
{
  unsigned __int128 end = (unsigned __int128) offset + length;

  return end <= size;
}

static void
judge (const struct nbd_request *r, const struct request_limits *x)
{
  const bool known = r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE ||
    r->type == NBD_CMD_FLUSH || r->type == NBD_CMD_TRIM ||
    r->type == NBD_CMD_WRITE_ZEROES ||
    (r->type == NBD_CMD_BLOCK_STATUS && x->block_status);
  const bool writes = r->type == NBD_CMD_WRITE || r->type == NBD_CMD_TRIM ||
    r->type == NBD_CMD_WRITE_ZEROES;
  uint32_t error = 12345;
  enum request_verdict v = request_check (r, x, &error);

  CHECK (v == REQUEST_REPLY || v == REQUEST_PROCEED);
  if (v == REQUEST_PROCEED) {
    CHECK (error == 0);
    CHECK (known);
    CHECK (flags_allowed (r->type, r->flags, x));
    CHECK (!(writes && x->read_only));
    CHECK (!(r->type == NBD_CMD_FLUSH && x->read_only));
    CHECK (!(r->type == NBD_CMD_TRIM && !x->discard));
    if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) {
      CHECK (r->length > 0);
      CHECK (r->length <= x->max_request);
      CHECK (inside (r->offset, r->length, x->size));
    }
    if (r->type == NBD_CMD_BLOCK_STATUS)  /* any length: a hint */
      CHECK (r->length > 0 && inside (r->offset, r->length, x->size));
    return;
  }
  /* Refused or answered without IO: with the error the spec asks for. */
  if (!known || !flags_allowed (r->type, r->flags, x))
    CHECK (error == NBD_EINVAL);
  else if (writes && x->read_only)
    CHECK (error == NBD_EPERM);
  else if (r->type == NBD_CMD_READ || r->type == NBD_CMD_BLOCK_STATUS)
    CHECK (error == NBD_EINVAL);          /* out of range, or empty */
  else if (r->type == NBD_CMD_WRITE)
    CHECK (error == (inside (r->offset, r->length, x->size)
                     ? 0 : NBD_ENOSPC));   /* 0: an empty write */
  else if (r->type == NBD_CMD_FLUSH)
    CHECK (error == 0 && x->read_only);
  else if (r->type == NBD_CMD_TRIM)
    CHECK (error == NBD_EINVAL && !x->discard);
  else
    CHECK (false);                          /* zeroes are always done */
  if (error == 0)
    CHECK ((r->type == NBD_CMD_WRITE && r->length == 0) ||
           (r->type == NBD_CMD_FLUSH && x->read_only));
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct request_limits x = { .size = 0 };
  size_t pos = 9;

  if (size < pos)
    return 0;
  x.read_only = data[0] & 1;
  x.discard = data[0] & 2;
  x.max_request = max_requests[(data[0] >> 2) & 3];
  x.block_status = data[0] & 16;
  x.structured_replies = data[0] & 32;
  x.size = get_be (data + 1, 8);

  while (size - pos >= NBD_REQUEST_SIZE) {
    const uint8_t *w = data + pos;
    struct nbd_request r;
    uint32_t error = 12345;
    enum request_verdict v;

    request_decode (w, &r);
    pos += NBD_REQUEST_SIZE;
    /* Decoding: every field, big-endian, nothing else. */
    CHECK (r.magic == get_be (w, 4));
    CHECK (r.flags == get_be (w + 4, 2));
    CHECK (r.type == get_be (w + 6, 2));
    CHECK (memcmp (r.cookie, w + 8, 8) == 0);
    CHECK (r.offset == get_be (w + 16, 8));
    CHECK (r.length == get_be (w + 24, 4));

    v = request_admit (&r, &x, &error);
    if (r.magic != NBD_REQUEST_MAGIC || r.type == NBD_CMD_DISC ||
        (r.type == NBD_CMD_WRITE && r.length > x.max_request)) {
      CHECK (v == REQUEST_CLOSE);
      return 0;                 /* the connection reads no more */
    }
    if (r.type == NBD_CMD_READ && r.length > x.max_request) {
      CHECK (v == REQUEST_REPLY && error == NBD_EINVAL);
      continue;
    }
    CHECK (v == REQUEST_PROCEED && error == 0);
    if (r.type == NBD_CMD_WRITE) {
      /* The payload follows; a request cut short is never judged. */
      if (size - pos < r.length)
        return 0;
      pos += r.length;
    }
    judge (&r, &x);
  }
  return 0;
}
