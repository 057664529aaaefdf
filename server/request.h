/* mloop-server — transmission-phase requests: decoding the 28-byte
 * header and deciding, from the header and the export alone, what a
 * request gets.  Pure functions: no sockets, no IO, no allocation, so the
 * decisions can be unit-tested and fuzzed (tests/fuzz/fuzz-request.c).
 *
 * conn.c asks twice per request: request_admit() as soon as the header
 * is in (may the connection go on, and does the request need a slot and
 * a buffer), and request_check() once a WRITE's payload is in too (reply
 * at once, or do the command's IO).  TRIM and WRITE_ZEROES ranges are
 * checked by the engine (engine/space.c), not here.
 */
#ifndef MLOOP_SERVER_REQUEST_H
#define MLOOP_SERVER_REQUEST_H

#include <stdbool.h>
#include <stdint.h>

#define NBD_REQUEST_SIZE 28

/* A request header in host byte order. */
struct nbd_request {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  char cookie[8];               /* opaque, echoed as received */
  uint64_t offset;
  uint32_t length;
};

/* What of the export decides a request's fate. */
struct request_limits {
  uint64_t size;
  bool read_only;
  bool discard;
  uint32_t max_request;         /* largest READ/WRITE accepted */
  bool block_status;            /* base:allocation negotiated */
  bool structured_replies;      /* negotiated: NBD_CMD_FLAG_DF allowed */
};

enum request_verdict {
  REQUEST_CLOSE,                /* read no more; close once idle */
  REQUEST_REPLY,                /* answer at once with the error given
                                   (0: success), no IO */
  REQUEST_PROCEED,              /* admit: take a slot, receive the payload;
                                   check: do the command */
};

/* Decodes NBD_REQUEST_SIZE bytes at WIRE into R. */
void request_decode (const void *wire, struct nbd_request *r);

/* The decision on a header just received: REQUEST_CLOSE for a bad magic,
 * NBD_CMD_DISC, or a WRITE larger than max_request (its payload cannot
 * be skipped safely); REQUEST_REPLY with NBD_EINVAL in *ERROR for a READ
 * larger than max_request; REQUEST_PROCEED otherwise.
 */
enum request_verdict request_admit (const struct nbd_request *r,
                                    const struct request_limits *x,
                                    uint32_t *error);

/* The decision on an admitted request (a WRITE with its payload in):
 * REQUEST_REPLY with the NBD error in *ERROR (0 when there is nothing to
 * do: an empty WRITE, a FLUSH of a read-only export), or REQUEST_PROCEED
 * when the command must be performed.  Never REQUEST_CLOSE.  A
 * BLOCK_STATUS is refused with NBD_EINVAL unless a context was
 * negotiated, and like a READ must be non-empty and inside the export.
 */
enum request_verdict request_check (const struct nbd_request *r,
                                    const struct request_limits *x,
                                    uint32_t *error);

#endif /* MLOOP_SERVER_REQUEST_H */
