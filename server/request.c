/* mloop-server — request decoding and validation.  See request.h. */
#include <endian.h>
#include <string.h>

#include "nbd_proto.h"
#include "request.h"

void
request_decode (const void *wire, struct nbd_request *r)
{
  const unsigned char *p = wire;
  uint32_t u32;
  uint16_t u16;
  uint64_t u64;

  memcpy (&u32, p, 4);
  r->magic = be32toh (u32);
  memcpy (&u16, p + 4, 2);
  r->flags = be16toh (u16);
  memcpy (&u16, p + 6, 2);
  r->type = be16toh (u16);
  memcpy (r->cookie, p + 8, 8);
  memcpy (&u64, p + 16, 8);
  r->offset = be64toh (u64);
  memcpy (&u32, p + 24, 4);
  r->length = be32toh (u32);
}

enum request_verdict
request_admit (const struct nbd_request *r, const struct request_limits *x,
               uint32_t *error)
{
  *error = 0;
  if (r->magic != NBD_REQUEST_MAGIC)
    return REQUEST_CLOSE;       /* garbage: this client is done */
  if (r->type == NBD_CMD_DISC)
    return REQUEST_CLOSE;
  if (r->length > x->max_request) {
    /* An oversized write's payload is on the wire and will not be
     * buffered; an oversized read is refused and the connection goes on.
     */
    if (r->type == NBD_CMD_WRITE)
      return REQUEST_CLOSE;
    if (r->type == NBD_CMD_READ) {
      *error = NBD_EINVAL;
      return REQUEST_REPLY;
    }
  }
  return REQUEST_PROCEED;
}

static bool
range_ok (const struct request_limits *x, uint64_t offset, uint32_t length)
{
  return offset <= x->size && length <= x->size - offset;
}

static enum request_verdict
reply (uint32_t *error, uint32_t nbd_error)
{
  *error = nbd_error;
  return REQUEST_REPLY;
}

enum request_verdict
request_check (const struct nbd_request *r, const struct request_limits *x,
               uint32_t *error)
{
  const uint16_t f = r->flags;

  *error = 0;
  switch (r->type) {
  case NBD_CMD_READ:
    /* DF asks for the data in one chunk: every READ is (conn.c). */
    if (f & ~(NBD_CMD_FLAG_FUA |
              (x->structured_replies ? NBD_CMD_FLAG_DF : 0)))
      return reply (error, NBD_EINVAL);
    if (!range_ok (x, r->offset, r->length) || r->length == 0)
      return reply (error, NBD_EINVAL);
    return REQUEST_PROCEED;
  case NBD_CMD_WRITE:
    if (f & ~NBD_CMD_FLAG_FUA)
      return reply (error, NBD_EINVAL);
    if (x->read_only)
      return reply (error, NBD_EPERM);
    if (!range_ok (x, r->offset, r->length))
      return reply (error, NBD_ENOSPC);
    if (r->length == 0)
      return reply (error, 0);
    return REQUEST_PROCEED;
  case NBD_CMD_FLUSH:
    if (f & ~NBD_CMD_FLAG_FUA)
      return reply (error, NBD_EINVAL);
    if (x->read_only)
      return reply (error, 0);  /* nothing to flush */
    return REQUEST_PROCEED;
  case NBD_CMD_TRIM:
    if (f & ~NBD_CMD_FLAG_FUA)
      return reply (error, NBD_EINVAL);
    if (x->read_only)
      return reply (error, NBD_EPERM);
    if (!x->discard)
      return reply (error, NBD_EINVAL);
    return REQUEST_PROCEED;     /* the engine checks the range */
  case NBD_CMD_WRITE_ZEROES:
    if (f & ~(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE |
              NBD_CMD_FLAG_FAST_ZERO))
      return reply (error, NBD_EINVAL);
    if (x->read_only)
      return reply (error, NBD_EPERM);
    return REQUEST_PROCEED;     /* the engine checks the range */
  case NBD_CMD_BLOCK_STATUS:
    if (f & ~NBD_CMD_FLAG_REQ_ONE)
      return reply (error, NBD_EINVAL);
    if (!x->block_status)
      return reply (error, NBD_EINVAL);   /* the spec's SHOULD */
    if (!range_ok (x, r->offset, r->length) || r->length == 0)
      return reply (error, NBD_EINVAL);
    return REQUEST_PROCEED;
  default:
    return reply (error, NBD_EINVAL);
  }
}
