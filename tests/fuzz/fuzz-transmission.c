/* libFuzzer target: mloop-server's transmission phase end to end in
 * process: a worker's event loop (server/worker.c) on a real image
 * through the IO engine, with a client on a socketpair.
 *
 * Input: the format of fuzz-request.c, so the two share a seed corpus:
 * one byte of export properties (bit 0 read-only, bit 1 discard, bit 2
 * a max-request limit of 4096 rather than 1 MiB; bit 3, which
 * fuzz-request ignores: the connection negotiated structured replies and
 * base:allocation; bit 4, which fuzz-request reads otherwise: the TLS
 * hand-off, below), 8 bytes of size
 * (ignored: the image is IMAGE_SIZE, an odd size, so the unaligned tail
 * is in play), then what the client sends.  The client sends it all,
 * shuts its side down and reads every reply until the worker closes.
 *
 * The TLS hand-off (bit 4): everything the client sends arrived with the
 * handshake's last TLS record, so it waits already decoded in the
 * connection's transport (here a stand-in for GnuTLS's buffer) and
 * nothing more comes through the socket, where the client stays
 * connected; the transport ends the stream once its bytes are read (an
 * input with no bytes to send is served as without bit 4).
 * A worker that waits for the socket to say there are requests never
 * answers them, and the input times out.
 *
 * Workers persist across inputs (one per combination of options, all on
 * one image), each input a new connection.  Besides memory and
 * undefined-behaviour errors, the target checks the replies against the
 * requests (docs/fuzzing.md): well-formed, one per request with its
 * cookie, read data of the asked length, the error the protocol asks for
 * each refusal, and every request answered unless the connection was
 * cut mid-payload.  With structured replies: a READ or BLOCK_STATUS
 * answered by one chunk flagged DONE (OFFSET_DATA at the asked offset;
 * BLOCK_STATUS under the selected id, descriptors non-empty, within the
 * request, one under REQ_ONE), every error an ERROR chunk, a simple
 * reply only for the other commands' success.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "client.h"
#include "engine.h"
#include "check.h"
#include "nbd_proto.h"
#include "request.h"
#include "worker.h"

#define IMAGE_SIZE  ((4u << 20) + 3000)
#define MAX_EXPECT  4096        /* requests tracked per input */

static struct mloop_engine engine;
static struct worker *workers[8];       /* by the input's bits 0-2 */

static void
die (const char *what, const char *msg)
{
  fprintf (stderr, "fuzz-transmission: %s: %s\n", what, msg);
  exit (1);
}

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  const char *dir = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/var/tmp";
  struct mloop_engine_config cfg;
  char path[4096], err[256];
  int fd;

  /* A real file on a real filesystem, so O_DIRECT and AIO are exercised;
   * unlinked once open, so nothing is left behind.
   */
  snprintf (path, sizeof path, "%s/mloop-fuzz-XXXXXX", dir);
  fd = mkstemp (path);
  if (fd == -1 || ftruncate (fd, IMAGE_SIZE) == -1)
    die (path, "cannot create the image");
  close (fd);
  mloop_engine_config_init (&cfg);
  cfg.path = path;
  if (mloop_engine_open (&engine, &cfg, err, sizeof err) < 0)
    die ("engine", err);
  unlink (path);
  mloop_engine_probe_features (&engine);
  return 0;
}

static struct worker *
worker_for (unsigned bits)
{
  static struct budget budget;
  static struct offload *offload;

  if (offload == NULL) {
    budget_init (&budget, BUDGET_SERVER_DEFAULT, BUDGET_CONN_DEFAULT);
    offload = offload_start (2);
    if (offload == NULL)
      die ("offload", "cannot start helper threads");
  }
  if (workers[bits] == NULL) {
    struct worker_options o = {
      .budget = &budget,
      .offload = offload,
      .drain_timeout = 1,
      .engine = &engine,
      .read_only = bits & 1,
      .discard = bits & 2,
      .max_request = (bits & 4) ? 4096 : 1u << 20,
      .ring_depth = 64,
    };
    char err[256];

    workers[bits] = worker_start (&o, err, sizeof err);
    if (workers[bits] == NULL)
      die ("worker", err);
  }
  return workers[bits];
}

struct expect {
  uint16_t type, flags;
  uint64_t offset;
  uint32_t length;
  bool answered;
};

/* The stand-in for a TLS session holding decoded bytes (bit 4). */
struct decoded {
  int fd;
  const uint8_t *data;
  size_t len, pos;
};

static ssize_t
decoded_recv (void *ctx, void *buf, size_t n)
{
  struct decoded *d = ctx;

  if (n > d->len - d->pos)
    n = d->len - d->pos;
  memcpy (buf, d->data + d->pos, n);
  d->pos += n;
  return (ssize_t) n;           /* 0 once read: the stream ends */
}

static ssize_t
decoded_sendv (void *ctx, const struct iovec *iov, size_t n)
{
  struct decoded *d = ctx;
  struct msghdr m = { .msg_iov = (struct iovec *) iov, .msg_iovlen = n };

  return sendmsg (d->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
}

static bool
decoded_pending (void *ctx)
{
  struct decoded *d = ctx;

  return d->pos < d->len;
}

static void
decoded_close (void *ctx)
{
  free (ctx);
}

static int
decoded_full (void *ctx, void *buf, size_t n)
{
  (void) ctx, (void) buf, (void) n;
  abort ();                     /* the handshake's: not in transmission */
}

static int
decoded_send_full (void *ctx, const void *buf, size_t n)
{
  (void) ctx, (void) buf, (void) n;
  abort ();
}

static const struct transport_ops decoded_ops = {
  .recv_full = decoded_full,
  .send_full = decoded_send_full,
  .recv = decoded_recv,
  .sendv = decoded_sendv,
  .pending = decoded_pending,
  .close = decoded_close,
};

static bool
inside (uint64_t offset, uint32_t length)
{
  return (unsigned __int128) offset + length <= IMAGE_SIZE;
}

/* The error the protocol asks for when E must be refused (0 for what
 * needs no IO), or -1 when it must be performed.
 */
static int64_t
refusal (const struct expect *e, unsigned bits)     /* bits 0-3 */
{
  const bool ro = bits & 1, discard = bits & 2;
  const uint32_t max = (bits & 4) ? 4096 : 1u << 20;
  const uint16_t f = e->flags;

  switch (e->type) {
  case NBD_CMD_READ:
    /* DF (one chunk: every READ is) with structured replies only. */
    if (e->length > max ||
        (f & ~(NBD_CMD_FLAG_FUA | ((bits & 8) ? NBD_CMD_FLAG_DF : 0))) ||
        !inside (e->offset, e->length) || e->length == 0)
      return NBD_EINVAL;
    return -1;
  case NBD_CMD_WRITE:
    if (f & ~NBD_CMD_FLAG_FUA) return NBD_EINVAL;
    if (ro) return NBD_EPERM;
    if (!inside (e->offset, e->length)) return NBD_ENOSPC;
    return e->length == 0 ? 0 : -1;
  case NBD_CMD_FLUSH:
    if (f & ~NBD_CMD_FLAG_FUA) return NBD_EINVAL;
    return ro ? 0 : -1;
  case NBD_CMD_TRIM:
    if (f & ~NBD_CMD_FLAG_FUA) return NBD_EINVAL;
    if (ro) return NBD_EPERM;
    if (!discard || !inside (e->offset, e->length)) return NBD_EINVAL;
    return -1;
  case NBD_CMD_WRITE_ZEROES:
    if (f & ~(NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE |
              NBD_CMD_FLAG_FAST_ZERO))
      return NBD_EINVAL;
    if (ro) return NBD_EPERM;
    if (!inside (e->offset, e->length)) return NBD_ENOSPC;
    return -1;
  case NBD_CMD_BLOCK_STATUS:
    if (!(bits & 8) || (f & ~NBD_CMD_FLAG_REQ_ONE) ||
        !inside (e->offset, e->length) || e->length == 0)
      return NBD_EINVAL;
    return -1;
  default:
    return NBD_EINVAL;
  }
}

/* One structured reply chunk at P (LEFT bytes to the end of the
 * answer), for one of the N requests in EX: marks it answered, sets
 * *ERROR, and returns its size.
 */
static size_t
check_chunk (const uint8_t *p, size_t left, struct expect *ex, size_t n,
             uint32_t *error)
{
  uint16_t flags, type;
  uint64_t cookie;
  uint32_t len;
  struct expect *e;

  CHECK (left >= 20);
  flags = (uint16_t) get_be (p + 4, 2);
  type = (uint16_t) get_be (p + 6, 2);
  cookie = get_be (p + 8, 8);
  len = (uint32_t) get_be (p + 16, 4);
  CHECK (left - 20 >= len);     /* whole */
  CHECK (flags == NBD_REPLY_FLAG_DONE);   /* one chunk per reply */
  CHECK (cookie < n);
  e = &ex[cookie];
  CHECK (!e->answered);
  e->answered = true;
  p += 20;
  *error = 0;
  switch (type) {
  case NBD_REPLY_TYPE_ERROR:
    CHECK (len == 6 && get_be (p + 4, 2) == 0);
    *error = (uint32_t) get_be (p, 4);
    CHECK (*error != 0);
    break;
  case NBD_REPLY_TYPE_OFFSET_DATA:
    CHECK (e->type == NBD_CMD_READ);
    CHECK (len == 8 + e->length && get_be (p, 8) == e->offset);
    break;
  case NBD_REPLY_TYPE_BLOCK_STATUS: {
    uint64_t sum = 0;
    uint32_t i, count;

    CHECK (e->type == NBD_CMD_BLOCK_STATUS);
    CHECK (len >= 12 && (len - 4) % 8 == 0);
    CHECK (get_be (p, 4) == SESSION_BASE_ALLOCATION_ID);
    count = (len - 4) / 8;
    CHECK (!(e->flags & NBD_CMD_FLAG_REQ_ONE) || count == 1);
    for (i = 0; i < count; i++) {
      uint32_t dlen = (uint32_t) get_be (p + 4 + 8 * i, 4);
      uint32_t dflags = (uint32_t) get_be (p + 8 + 8 * i, 4);

      CHECK (dlen > 0);
      CHECK (dflags == 0 || dflags == (NBD_STATE_HOLE | NBD_STATE_ZERO));
      sum += dlen;
    }
    CHECK (sum <= e->length);
    break;
  }
  default:
    CHECK (!"an unexpected chunk type");
  }
  return 20 + len;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static struct expect ex[MAX_EXPECT];
  const unsigned bits = size ? data[0] & 7 : 0;
  const uint32_t max = (bits & 4) ? 4096 : 1u << 20;
  size_t pos = 9, n = 0, i, o;
  bool cut = false;             /* ended mid-payload: replies may be lost */
  struct fuzz_client c;
  const bool sr = size && (data[0] & 8);
  /* With nothing decoded there is nothing to hand off: in a real session
   * the client's close would then reach the socket.
   */
  const bool handoff = size > 9 && (data[0] & 16);
  struct session session = {
    .structured_replies = sr, .base_allocation = sr,
  };
  int sv[2];

  uint8_t *wire;

  if (size < pos)
    return 0;
  /* What the worker will have to answer.  Cookies are opaque to the
   * server: they are made unique (the request's index), so that each
   * reply names one request, and its data length is known, whatever
   * order the IO completes in.
   */
  wire = malloc (size);
  if (wire == NULL)
    abort ();
  memcpy (wire, data, size);
  while (size - pos >= NBD_REQUEST_SIZE && n < MAX_EXPECT) {
    struct nbd_request r;

    for (i = 0; i < 8; i++)
      wire[pos + 8 + i] = (uint8_t) ((uint64_t) n >> (56 - 8 * i));
    request_decode (wire + pos, &r);
    pos += NBD_REQUEST_SIZE;
    if (r.magic != NBD_REQUEST_MAGIC || r.type == NBD_CMD_DISC ||
        (r.type == NBD_CMD_WRITE && r.length > max))
      break;                    /* the worker reads no further */
    if (r.type == NBD_CMD_WRITE) {
      if (size - pos < r.length) {
        cut = true;
        break;
      }
      pos += r.length;
    }
    ex[n++] = (struct expect) {
      .type = r.type, .flags = r.flags, .offset = r.offset,
      .length = r.length,
    };
  }
  if (n == MAX_EXPECT) {
    free (wire);
    return -1;                  /* too long to track: not kept */
  }

  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == -1)
    abort ();
  if (handoff) {
    struct decoded *d = malloc (sizeof *d);

    if (d == NULL)
      abort ();
    *d = (struct decoded) { .fd = sv[0], .data = wire + 9, .len = size - 9 };
    session.transport = (struct transport) { .ops = &decoded_ops, .ctx = d };
    fuzz_client_start (&c, sv[1], NULL, 0, FUZZ_CLIENT_STAY_OPEN);
  }
  else
    fuzz_client_start (&c, sv[1], wire + 9, size - 9, FUZZ_CLIENT_SHUT_WR);
  worker_add_connection (worker_for (bits), sv[0], &session);
  fuzz_client_join (&c);        /* the worker closed the connection */

  for (o = 0; c.out_len - o >= 16; ) {
    const uint8_t *p = c.out + o;
    uint32_t error = (uint32_t) get_be (p + 4, 4);
    uint64_t cookie = get_be (p + 8, 8);
    struct expect *e;
    int64_t want;

    if (sr && get_be (p, 4) == NBD_STRUCTURED_REPLY_MAGIC) {
      o += check_chunk (c.out + o, c.out_len - o, ex, n, &error);
      e = &ex[cookie];          /* check_chunk checked it */
      want = refusal (e, bits | 8);
      if (want >= 0)
        CHECK (error == (uint32_t) want);
      else
        CHECK (error == 0);
      continue;
    }
    CHECK (get_be (p, 4) == NBD_SIMPLE_REPLY_MAGIC);
    o += 16;
    CHECK (cookie < n);         /* a reply to a request that was sent */
    e = &ex[cookie];
    CHECK (!e->answered);       /* once */
    e->answered = true;
    /* Structured replies: a simple reply only for success, and never
     * for a READ or BLOCK_STATUS.
     */
    CHECK (!sr || (error == 0 && e->type != NBD_CMD_READ &&
                   e->type != NBD_CMD_BLOCK_STATUS));
    want = refusal (e, bits);
    if (want >= 0)
      CHECK (error == (uint32_t) want);
    else                        /* a healthy image: no IO error at all */
      CHECK (error == 0 ||
             (error == NBD_ENOTSUP && e->type == NBD_CMD_WRITE_ZEROES &&
              (e->flags & NBD_CMD_FLAG_FAST_ZERO)));
    if (e->type == NBD_CMD_READ && error == 0) {
      CHECK (c.out_len - o >= e->length);   /* the data, all of it */
      o += e->length;
    }
  }
  /* Nothing but whole replies, one per request; a client that stopped
   * mid-payload may lose them (the worker then drops what is queued).
   */
  if (!cut) {
    CHECK (o == c.out_len);
    for (i = 0; i < n; i++)
      CHECK (ex[i].answered);
  }
  free (c.out);
  free (wire);
  return 0;
}
