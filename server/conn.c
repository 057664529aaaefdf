/* mloop-server — one client connection in transmission phase: its socket
 * in and out, its slots and buffers.  See conn.h.
 */
#include <endian.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "align.h"
#include "budget.h"
#include "conn.h"
#include "dispatch.h"
#include "log_limit.h"
#include "nbd_proto.h"
#include "request.h"
#include "transport.h"

/* Received bytes a connection buffers for parsing: one recv's worth. */
#define CONN_INBUF (64 * 1024)
/* Pieces one sendmsg carries at most; a reply is one or two of them,
 * its header and any READ data.
 */
#define SEND_IOVECS 128
#define IOVECS_PER_REPLY 2
/* Room for several 1 MiB read replies in the socket, so one sendmsg
 * carries them instead of a wake-up per ~200 KiB of the default buffer.
 * Best effort: the kernel caps it at net.core.wmem_max.
 */
#define SEND_BUFFER (4 << 20)

static size_t
page_size (void)
{
  static size_t page;

  if (page == 0)
    page = (size_t) sysconf (_SC_PAGESIZE);
  return page;
}

static void
conn_update_events (struct conn *c)
{
  struct epoll_event ev = { 0 };

  if (c->broken) {
    /* Nothing more to read or send: stop hearing about this socket. */
    epoll_ctl (c->set->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    return;
  }
  if (!c->reading_paused && !c->closing)
    ev.events |= EPOLLIN;
  if (c->want_write)
    ev.events |= EPOLLOUT;
  ev.data.ptr = c;
  epoll_ctl (c->set->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* ------------------------------------------------------------ replies */

static void
mark_dirty (struct conn *c)
{
  if (!c->dirty) {
    c->dirty = true;
    c->next_dirty = c->set->dirty;
    c->set->dirty = c;
  }
}

/* The peer cannot take replies any more: read nothing more, and drop
 * what is queued at the next flush.
 */
static void
conn_break (struct conn *c)
{
  if (!c->broken) {
    c->broken = c->closing = true;
    conn_update_events (c);
    mark_dirty (c);             /* conn_flush drops the queue */
  }
}

static enum mloop_stats_command
stats_command (uint16_t type)
{
  switch (type) {
  case NBD_CMD_READ: return MLOOP_STATS_READ;
  case NBD_CMD_WRITE: return MLOOP_STATS_WRITE;
  case NBD_CMD_FLUSH: return MLOOP_STATS_FLUSH;
  case NBD_CMD_TRIM: return MLOOP_STATS_TRIM;
  case NBD_CMD_WRITE_ZEROES: return MLOOP_STATS_ZERO;
  default: return MLOOP_STATS_OTHER;
  }
}

/* Counts a request as answered. */
static void
count_reply (struct mloop_stats *st, const struct request *req,
             uint32_t nbd_error)
{
  if (st == NULL)
    return;
  MLOOP_STATS_ADD (st, requests[stats_command (req->type)], 1);
  MLOOP_STATS_SUB (st, in_flight, 1);
  if (nbd_error)
    MLOOP_STATS_ADD (st, errors, 1);
  else if (req->type == NBD_CMD_READ)
    MLOOP_STATS_ADD (st, bytes_read, req->io.count);
  else if (req->type == NBD_CMD_WRITE)
    MLOOP_STATS_ADD (st, bytes_written, req->io.count);
}

/* The header of a simple reply: magic, error, cookie. */
#define SIMPLE_REPLY_SIZE 16
/* The header of a structured reply chunk: magic, flags, type, cookie,
 * length; its fixed fields follow.
 */
#define CHUNK_HEADER_SIZE 20

/* Makes REQ's reply the one chunk of a structured reply, of TYPE, with
 * FIXED bytes of req->reply.fixed (set by the caller) and DATA_LEN bytes
 * of req->buf.
 */
static void
set_chunk (struct request *req, uint16_t type, uint8_t fixed, size_t data_len)
{
  req->reply.magic = htobe32 (NBD_STRUCTURED_REPLY_MAGIC);
  req->reply.flags = htobe16 (NBD_REPLY_FLAG_DONE);
  req->reply.type = htobe16 (type);
  req->reply.length = htobe32 ((uint32_t) (fixed + data_len));
  req->reply_len = CHUNK_HEADER_SIZE + fixed;
  req->data_len = data_len;
}

/* With structured replies: READ data as one NBD_REPLY_TYPE_OFFSET_DATA
 * chunk, extents as one NBD_REPLY_TYPE_BLOCK_STATUS chunk (one context),
 * any error as NBD_REPLY_TYPE_ERROR without a message (the spec forbids
 * a simple reply to a READ, even for an error).  Each chunk is the whole
 * reply, so it carries DONE: nothing is sent before the result is known.
 */
static void
structured_reply (struct request *req, uint32_t nbd_error)
{
  if (nbd_error) {
    uint32_t be_error = htobe32 (nbd_error);

    memcpy (req->reply.fixed, &be_error, 4);
    memset (req->reply.fixed + 4, 0, 2);        /* message length */
    set_chunk (req, NBD_REPLY_TYPE_ERROR, 6, 0);
  }
  else if (req->type == NBD_CMD_READ) {
    uint64_t be_offset = htobe64 (req->io.offset);

    memcpy (req->reply.fixed, &be_offset, 8);
    set_chunk (req, NBD_REPLY_TYPE_OFFSET_DATA, 8, req->io.count);
  }
  else {
    uint32_t be_id = htobe32 (SESSION_BASE_ALLOCATION_ID);

    memcpy (req->reply.fixed, &be_id, 4);
    set_chunk (req, NBD_REPLY_TYPE_BLOCK_STATUS, 4, req->data_len);
  }
}

void
conn_queue_reply (struct request *req, uint32_t nbd_error)
{
  struct conn *c = req->conn;

  count_reply (c->set->opts->stats, req, nbd_error);
  TRACE_REQUEST (MLOOP_TRACE_COMPLETE, req, (int) nbd_error);

  req->error = nbd_error;
  if (c->session.structured_replies &&
      (nbd_error || req->type == NBD_CMD_READ ||
       req->type == NBD_CMD_BLOCK_STATUS))
    structured_reply (req, nbd_error);
  else {
    /* As before structured replies: what the kernel client reads. */
    req->reply.magic = htobe32 (NBD_SIMPLE_REPLY_MAGIC);
    req->reply.error = htobe32 (nbd_error);
    req->reply_len = SIMPLE_REPLY_SIZE;
    req->data_len = (req->type == NBD_CMD_READ && nbd_error == 0)
      ? req->io.count : 0;
  }
  req->next = NULL;
  if (c->out_tail)
    c->out_tail->next = req;
  else
    c->out_head = req;
  c->out_tail = req;
  mark_dirty (c);
}

/* Queues C to be read at the top of the event loop's next turn, for
 * bytes epoll will not announce: already in our buffer, or decoded by
 * TLS and held in its buffer rather than in the socket.
 */
static void
mark_ready (struct conn *c)
{
  if (c->on_ready)
    return;
  c->on_ready = true;
  c->next_ready = c->set->ready;
  c->set->ready = c;
}

/* Lets C read again after a pause for lack of a slot, ring room or
 * budget.
 */
static void
resume_reading (struct conn *c)
{
  if (c->budget_wait) {
    c->budget_wait = false;
    c->set->budget_waiters--;
  }
  c->reading_paused = false;
  conn_update_events (c);
  /* Bytes TLS has already decoded are not in the socket either. */
  if (c->in_end > c->in_start || c->receiving ||
      transport_pending (&c->session.transport))
    mark_ready (c);
}

/* Frees a buffer the socket no longer holds, or whose pages are
 * dropped from our mapping first (splice_out_forget) when it may.
 */
static void
free_lent (struct conn *c, void *buf, size_t cap, bool returned)
{
  if (!returned)
    splice_out_forget (buf, cap);
  budget_release (c->set->opts->budget, cap);
  mloop_free_aligned (buf, cap);
  c->set->heap_used = true;
}

static void
pop_lent (struct conn *c)
{
  c->lent_bytes -= c->lent[c->lent_first].cap;
  c->lent_first = (c->lent_first + 1) % CONN_LENT_MAX;
  c->lent_count--;
}

/* Frees the oldest parked buffer, which the socket has given back or
 * not (RETURNED).
 */
static void
free_oldest_lent (struct conn *c, bool returned)
{
  struct lent_buffer *l = &c->lent[c->lent_first];

  free_lent (c, l->buf, l->cap, returned);
  pop_lent (c);
}

/* Frees, oldest first, the parked buffers the socket has given back,
 * leaving KEEP bytes parked for reuse (take_returned); with FORCE, all
 * of them, given back or not (the connection is going).
 */
static void
free_returned_lent (struct conn *c, uint64_t keep, bool force)
{
  while (c->lent_count > 0 && (force || c->lent_bytes > keep)) {
    bool returned = splice_out_returned (&c->splice, c->fd,
                                         c->lent[c->lent_first].until);

    if (!returned && !force)
      return;
    free_oldest_lent (c, returned);
  }
}

/* The oldest parked buffer, if the socket gave it back and it fits a
 * request of N bytes at ALIGN without wasting half of it: taken, still
 * charged to the budget.
 */
static bool
take_returned (struct conn *c, size_t n, uint32_t align, void **buf,
               size_t *cap)
{
  struct lent_buffer *l = &c->lent[c->lent_first];

  if (c->lent_count == 0 || l->cap < n || l->cap / 2 > n ||
      (uintptr_t) l->buf % align ||
      !splice_out_returned (&c->splice, c->fd, l->until))
    return false;
  *buf = l->buf;
  *cap = l->cap;
  pop_lent (c);
  return true;
}

/* Takes REQ's buffer from its slot while the socket may still hold its
 * pages: parked until the socket gives them back, then reused for a
 * later request (take_returned) or freed.  Dropping the pages at once
 * instead would make the next buffer fault in and zero every page again
 * (measured: more guest CPU per read than the copy this saves); so would
 * freeing them into the heap, which glibc trims past 4 MiB (main.c).  A
 * full park drops the oldest's pages.  The budget stays charged
 * meanwhile.
 */
static void
park_lent (struct conn *c, struct request *req)
{
  if (c->lent_count == CONN_LENT_MAX)
    free_oldest_lent (c, splice_out_returned (&c->splice, c->fd,
                                              c->lent[c->lent_first].until));
  c->lent[(c->lent_first + c->lent_count++) % CONN_LENT_MAX] =
    (struct lent_buffer) { req->buf, req->cap, req->lent_until };
  c->lent_bytes += req->cap;
  req->buf = NULL;
  req->cap = 0;
  req->lent_until = 0;
  c->set->heap_used = true;     /* the idle trim frees it, if not before */
}

/* Whether REQ's buffer is ours to write again (not lent, or given
 * back), forgetting that it was lent.
 */
static bool
buffer_is_ours (struct conn *c, struct request *req)
{
  if (req->lent_until &&
      !splice_out_returned (&c->splice, c->fd, req->lent_until))
    return false;
  req->lent_until = 0;
  return true;
}

/* Gives REQ's buffer back, uncharged from its connection.  A small one
 * is kept for the slot's next request, so the next request of a busy
 * connection neither allocates nor faults its pages in again: up to
 * BUDGET_KEEP_PER_CONN a connection, and only while the server's budget
 * is less than half used, since a kept buffer stays charged to it (so
 * --buffer-limit bounds kept buffers too).  Otherwise it is freed, or
 * parked while lent.
 */
static void
release_buffer (struct conn *c, struct request *req)
{
  struct budget *b = c->set->opts->budget;

  if (!req->charged)
    return;                     /* none, or already kept */
  req->charged = false;
  c->held -= req->cap;
  if (req->cap <= MLOOP_KEEP_BUFFER &&
      c->kept + req->cap <= BUDGET_KEEP_PER_CONN && budget_may_keep (b))
    c->kept += req->cap;
  else if (!buffer_is_ours (c, req))
    park_lent (c, req);
  else {
    budget_release (b, req->cap);
    mloop_free_aligned (req->buf, req->cap);
    req->buf = NULL;
    req->cap = 0;
  }
}

/* Whether C has a slot for another request. */
static bool
slot_free (const struct conn *c)
{
  return c->free != NULL || c->fresh < CONN_SLOTS;
}

/* A slot for a request: one given back, else the next never used (its
 * pages touched only now).  The caller made sure there is one.
 */
static struct request *
take_slot (struct conn *c)
{
  struct request *req = c->free;

  if (req) {
    c->free = req->next;
    return req;
  }
  req = &c->slots[c->fresh++];
  memset (req, 0, sizeof *req);
  return req;
}

static void
release_slot (struct conn *c, struct request *req)
{
  release_buffer (c, req);
  req->next = c->free;
  c->free = req;
  c->busy--;
  if (c->reading_paused && !c->closing)
    resume_reading (c);
}

/* Whether REQ's data goes to the socket by page reference. */
static bool
reply_spliced (const struct conn *c, const struct request *req)
{
  return splice_out_enabled (&c->splice) && req->type == NBD_CMD_READ &&
    req->error == 0 && req->data_len >= SPLICE_OUT_MIN;
}

/* Retires the replies at the head of the queue that are wholly out. */
static void
retire_sent (struct conn *c)
{
  while (c->out_head) {
    struct request *head = c->out_head;
    size_t whole = head->reply_len + head->data_len;

    if (c->out_sent < whole)
      break;
    c->out_sent -= whole;
    c->out_head = head->next;
    if (!c->out_head)
      c->out_tail = NULL;
    TRACE_REQUEST (MLOOP_TRACE_REPLY, head, 0);
    release_slot (c, head);
  }
}

/* Lends the data of the head reply, whose header is out, to the pipe.
 * The pipe is empty here, so it takes something unless vmsplice itself
 * fails, which nothing the client does can cause (the pipe is ours):
 * then this connection copies its replies from here on, the rest of
 * this one included, and nothing is lost.
 */
static void
lend_head_data (struct conn *c)
{
  struct request *req = c->out_head;
  size_t done = c->out_sent - req->reply_len;
  ssize_t n = splice_out_lend (&c->splice, (char *) req->buf + done,
                               req->data_len - done);

  if (n <= 0) {
    log_limited ("a connection copies its read replies from now on: "
                 "vmsplice: %s", n == 0 ? "took nothing" : strerror (errno));
    splice_out_close (&c->splice);
    return;
  }
  c->out_sent += (size_t) n;
  req->lent_until = c->splice.to_socket + c->splice.in_pipe;
  retire_sent (c);
}

/* Sends as much of the reply queue as the socket takes: one sendmsg per
 * SEND_IOVECS pieces, and for a spliced reply its header by sendmsg and
 * its data through the pipe, which is emptied before anything else goes.
 */
static void
conn_flush (struct conn *c)
{
  while ((c->out_head || c->splice.in_pipe) && !c->broken) {
    struct iovec iov[SEND_IOVECS];
    struct msghdr msg = { .msg_iov = iov };
    struct request *req = c->out_head;
    size_t skip = c->out_sent;
    int n = 0;
    ssize_t sent;

    if (c->splice.in_pipe) {
      int r = splice_out_drain (&c->splice, c->fd);

      if (r == 1)
        goto socket_full;
      if (r == -1)
        c->broken = c->closing = true;
      continue;
    }
    if (reply_spliced (c, req) && skip >= req->reply_len) {
      lend_head_data (c);
      continue;
    }
    for (; req && n + IOVECS_PER_REPLY <= SEND_IOVECS; req = req->next) {
      size_t hlen = req->reply_len;

      if (skip < hlen) {
        iov[n].iov_base = (char *) &req->reply + skip;
        iov[n++].iov_len = hlen - skip;
        skip = 0;
      }
      else
        skip -= hlen;
      if (reply_spliced (c, req))
        break;                  /* its data goes through the pipe */
      if (req->data_len > skip) {
        iov[n].iov_base = (char *) req->buf + skip;
        iov[n++].iov_len = req->data_len - skip;
      }
      skip = 0;
    }
    msg.msg_iovlen = (size_t) n;
    sent = transport_sendmsg (&c->session.transport, c->fd, &msg);
    if (sent == -1 && errno == EINTR)
      continue;
    if (sent == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
      goto socket_full;
    if (sent == -1) {
      c->broken = c->closing = true;   /* the client went away */
      break;
    }
    c->out_sent += (size_t) sent;
    splice_out_count (&c->splice, (size_t) sent);
    retire_sent (c);
  }
  if (c->broken) {
    /* Nobody to send to: drop the queue. */
    while (c->out_head) {
      struct request *head = c->out_head;

      c->out_head = head->next;
      TRACE_REQUEST (MLOOP_TRACE_DROP, head, 0);
      release_slot (c, head);
    }
    c->out_tail = NULL;
    c->out_sent = 0;
  }
  if (c->want_write && !c->out_head && !c->splice.in_pipe) {
    c->want_write = false;
    conn_update_events (c);
  }
  free_returned_lent (c, budget_may_keep (c->set->opts->budget)
                      ? CONN_LENT_SPARE : 0, false);
  return;

 socket_full:
  if (!c->want_write) {
    c->want_write = true;
    conn_update_events (c);
  }
}

void
conn_set_flush (struct conn_set *s)
{
  while (s->dirty) {
    struct conn *c = s->dirty;

    s->dirty = c->next_dirty;
    c->dirty = false;
    conn_flush (c);
  }
}

/* ------------------------------------------------------------ requests */

/* Gives REQ an aligned buffer of at least N bytes, charged to its
 * connection and to the server: the slot's kept buffer if big enough
 * (already charged to the server), else a new one.
 */
static int
ensure_buffer (struct conn *c, struct request *req, size_t n, uint32_t align)
{
  struct budget *b = c->set->opts->budget;

  /* A buffer that may be lent is whole pages: its pages can then be
   * dropped while lent without touching a neighbour's (splice_out.h).
   */
  if (splice_out_enabled (&c->splice))
    n = mloop_round_up (n, page_size ());
  if (req->buf && !buffer_is_ours (c, req)) {
    if (req->charged) {
      c->held -= req->cap;
      req->charged = false;
    }
    else
      c->kept -= req->cap;
    park_lent (c, req);
  }
  if (req->buf && !req->charged) {
    c->kept -= req->cap;        /* leaves the kept pool either way */
    req->charged = true;
    c->held += req->cap;
  }
  if (req->buf && req->cap >= n)
    return 0;
  if (req->charged) {
    c->held -= req->cap;
    budget_release (b, req->cap);
    req->charged = false;
  }
  mloop_free_aligned (req->buf, req->cap);
  if (take_returned (c, n, align, &req->buf, &req->cap)) {
    req->charged = true;        /* the budget has it already */
    c->held += req->cap;
    return 0;
  }
  req->buf = mloop_alloc_aligned (n, align);
  req->cap = req->buf ? n : 0;
  if (req->buf == NULL)
    return -1;
  c->set->heap_used = true;
  req->charged = true;
  c->held += req->cap;
  budget_charge (b, req->cap);
  return 0;
}

/* The export's properties, and what C negotiated, that request_admit()
 * and request_check() decide by.
 */
static struct request_limits
limits (const struct conn *c)
{
  const struct worker_options *opts = c->set->opts;

  return (struct request_limits) {
    .size = mloop_engine_size (opts->engine),
    .read_only = opts->read_only,
    .discard = opts->discard,
    .max_request = opts->max_request,
    .block_status = c->session.base_allocation,
    .structured_replies = c->session.structured_replies,
  };
}

/* Decides on one request whose header (and, for a WRITE, its payload)
 * has been received: answered at once, or handed to the engine.  Every
 * check happens before any IO.
 */
static void
validate_and_dispatch (struct conn *c, struct request *req, uint64_t offset,
                       uint32_t length)
{
  const struct request_limits x = limits (c);
  const struct nbd_request h = {
    .magic = NBD_REQUEST_MAGIC, .flags = req->flags, .type = req->type,
    .offset = offset, .length = length,
  };
  uint32_t error;

  if (atomic_load (c->set->stopping)) {
    conn_queue_reply (req, NBD_ESHUTDOWN);
    return;
  }
  if (request_check (&h, &x, &error) == REQUEST_REPLY) {
    conn_queue_reply (req, error);
    return;
  }
  dispatch_request (c->set->dispatch, req, offset, length);
}

static void
conn_close_when_idle (struct conn *c)
{
  c->closing = true;
  conn_update_events (c);
}

/* The buffer request H needs: its READ or WRITE data, or the
 * descriptors of a BLOCK_STATUS under a selected context; 0 for none
 * (and for a READ or WRITE past max_request, which is refused or
 * closes the connection before any buffer).
 */
static uint32_t
request_buffer (const struct conn *c, const struct nbd_request *h)
{
  if (h->type == NBD_CMD_BLOCK_STATUS)
    return c->session.base_allocation ? CONN_EXTENTS_BUFFER : 0;
  if ((h->type == NBD_CMD_READ || h->type == NBD_CMD_WRITE) &&
      h->length <= c->set->opts->max_request)
    return h->length;
  return 0;
}

/* Parses one request header at c->in + c->in_start.  Returns false when
 * the connection must stop reading (closing).
 */
static bool
parse_header (struct conn *c)
{
  const struct worker_options *opts = c->set->opts;
  const struct request_limits x = limits (c);
  struct nbd_request h;
  struct request *req;
  enum request_verdict v;
  uint32_t error;
  uint64_t offset;
  uint32_t length, length_needed;
  uint16_t type;

  request_decode (c->in + c->in_start, &h);
  c->in_start += NBD_REQUEST_SIZE;
  MLOOP_TRACE (MLOOP_TRACE_RECV, (unsigned) c->fd, h.cookie, 0, h.type,
               h.offset, h.length, 0);
  v = request_admit (&h, &x, &error);
  if (v == REQUEST_CLOSE) {
    if (h.magic != NBD_REQUEST_MAGIC)
      c->in_start = c->in_end;  /* garbage: this client is done */
    conn_close_when_idle (c);
    return false;
  }
  type = h.type;
  offset = h.offset;
  length = h.length;

  req = take_slot (c);
  c->busy++;
  MLOOP_STATS_ADD (opts->stats, in_flight, 1);
  req->conn = c;
  req->type = type;
  req->flags = h.flags;
  memcpy (req->reply.cookie, h.cookie, sizeof req->reply.cookie);
  req->data_len = 0;

  if (v == REQUEST_REPLY) {     /* an oversized read */
    conn_queue_reply (req, error);
    return true;
  }
  length_needed = request_buffer (c, &h);
  if (length_needed > 0 &&
      ensure_buffer (c, req, length_needed,
                     mloop_engine_info (opts->engine)->preferred_block_size) == -1) {
    if (type == NBD_CMD_WRITE) {
      conn_close_when_idle (c);
      MLOOP_STATS_SUB (opts->stats, in_flight, 1);      /* never answered */
      release_slot (c, req);
      return false;
    }
    conn_queue_reply (req, NBD_ENOMEM);
    return true;
  }
  req->io.offset = offset;      /* kept until the payload is in */
  req->io.count = length;
  if (type == NBD_CMD_WRITE && length > 0) {
    c->receiving = req;
    c->payload_done = 0;
    return true;
  }
  validate_and_dispatch (c, req, offset, length);
  return true;
}

/* Moves payload bytes for the WRITE being received; returns true once it
 * is complete (and dispatched).
 */
static bool
receive_payload (struct conn *c)
{
  struct request *req = c->receiving;
  size_t need = req->io.count - c->payload_done;
  size_t have = c->in_end - c->in_start;

  if (have > 0) {
    size_t n = have < need ? have : need;

    memcpy ((char *) req->buf + c->payload_done, c->in + c->in_start, n);
    c->in_start += n;
    c->payload_done += n;
    need -= n;
  }
  while (need > 0) {
    /* Straight into the aligned buffer: no copy for large writes. */
    ssize_t r = transport_recv (&c->session.transport, c->fd,
                                (char *) req->buf + c->payload_done, need);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return false;
    if (r <= 0) {
      c->closing = c->broken = true;
      c->receiving = NULL;
      MLOOP_STATS_SUB (c->set->opts->stats, in_flight, 1); /* never answered */
      release_slot (c, req);
      return false;
    }
    c->payload_done += (size_t) r;
    need -= (size_t) r;
  }
  c->receiving = NULL;
  validate_and_dispatch (c, req, req->io.offset, (uint32_t) req->io.count);
  return true;
}

/* ------------------------------------------------------------ budget */

/* Bytes of buffer the request at the head of C's input will need. */
static uint32_t
buffer_need (const struct conn *c)
{
  struct nbd_request h;

  request_decode (c->in + c->in_start, &h);
  if (h.magic != NBD_REQUEST_MAGIC)
    return 0;                   /* closes the connection: no buffer */
  return request_buffer (c, &h);
}

/* Whether the next request of C fits the budget (budget.h); notes what
 * it needs for a later look.
 */
static bool
budget_allows_next (struct conn *c)
{
  c->budget_need = buffer_need (c);
  return c->budget_need == 0 ||
    budget_may_take (c->set->opts->budget, c->held, c->budget_need);
}

/* Stops reading C until its replies drain (release_slot resumes it) or
 * the server's budget has room again (conn_set_retry_budget looks).
 */
static void
pause_for_budget (struct conn *c)
{
  c->reading_paused = true;
  if (!c->budget_wait) {
    c->budget_wait = true;
    c->set->budget_waiters++;
  }
  conn_update_events (c);
}

void
conn_set_retry_budget (struct conn_set *s)
{
  struct conn *c;

  for (c = s->all; c && s->budget_waiters; c = c->next)
    if (c->budget_wait && !c->closing &&
        budget_may_take (s->opts->budget, c->held, c->budget_need))
      resume_reading (c);
}

void
conn_set_resume_for_ring (struct conn_set *s)
{
  struct conn *c;

  for (c = s->all; c; c = c->next)
    if (c->reading_paused && !c->budget_wait && slot_free (c) && !c->closing)
      resume_reading (c);
}

/* ------------------------------------------------------------ reading */

/* Reads and handles every request available on C. */
static void
conn_read (struct conn *c)
{
  while (!c->closing) {
    if (c->receiving) {
      if (!receive_payload (c))
        return;
      continue;
    }
    if (c->in_end - c->in_start >= NBD_REQUEST_SIZE) {
      if (!slot_free (c) || dispatch_ring_full (c->set->dispatch)) {
        c->reading_paused = true;
        conn_update_events (c);
        return;
      }
      if (!budget_allows_next (c)) {
        pause_for_budget (c);
        return;
      }
      parse_header (c);
      continue;
    }
    /* Need more bytes: compact, then one recv for as much as is there. */
    memmove (c->in, c->in + c->in_start, c->in_end - c->in_start);
    c->in_end -= c->in_start;
    c->in_start = 0;
    {
      ssize_t r = transport_recv (&c->session.transport, c->fd,
                                  c->in + c->in_end, CONN_INBUF - c->in_end);

      if (r == -1 && errno == EINTR)
        continue;
      if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return;
      if (r <= 0) {             /* EOF or error: no more requests */
        c->closing = true;
        if (r == -1)
          c->broken = true;
        conn_update_events (c);
        return;
      }
      c->in_end += (size_t) r;
    }
  }
}

void
conn_set_read_ready (struct conn_set *s)
{
  while (s->ready) {
    struct conn *c = s->ready;

    s->ready = c->next_ready;
    c->on_ready = false;
    if (!atomic_load (s->stopping))
      conn_read (c);
  }
}

void
conn_handle_events (struct conn *c, uint32_t events)
{
  if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
      !atomic_load (c->set->stopping))
    conn_read (c);
  if (events & (EPOLLHUP | EPOLLERR))
    conn_break (c);             /* peer gone both ways */
  if (events & EPOLLOUT)
    mark_dirty (c);
}

/* ------------------------------------------------------------ lifecycle */

void
conn_adopt (struct conn_set *s, int fd, const struct session *session)
{
  /* Not calloc: that would write every slot's pages (take_slot). */
  struct conn *c = malloc (sizeof *c);
  struct epoll_event ev = { .events = EPOLLIN };

  if (c) {
    memset (c, 0, offsetof (struct conn, slots));
    c->in = malloc (CONN_INBUF);
  }
  if (c == NULL || c->in == NULL) {
    free (c);
    transport_close_copy (&session->transport);
    worker_close_client (s->opts, fd);
    return;
  }
  c->fd = fd;
  c->set = s;
  c->session = *session;
  setsockopt (fd, SOL_SOCKET, SO_SNDBUF, &(int) { SEND_BUFFER }, sizeof (int));
  /* TLS encrypts into buffers of its own: nothing to lend. */
  if (session->transport.ops != NULL || !s->opts->splice_replies)
    c->splice = (struct splice_out) { .pipe_rd = -1, .pipe_wr = -1 };
  else if (splice_out_open (&c->splice, fd) == -1)
    log_limited ("a connection copies its read replies: no pipe to splice "
                 "them: %s", strerror (errno));
  ev.data.ptr = c;
  if (epoll_ctl (s->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
    splice_out_close (&c->splice);
    transport_close (&c->session.transport);
    free (c->in);
    free (c);
    worker_close_client (s->opts, fd);
    return;
  }
  c->next = s->all;
  s->all = c;
  MLOOP_STATS_ADD (s->opts->stats, connections, 1);
  MLOOP_STATS_ADD (s->opts->stats, connections_total, 1);
  /* The handshake's last TLS record may have carried the first requests
   * too (a client pipelining after NBD_OPT_GO or EXPORT_NAME): GnuTLS
   * holds them decoded, and the socket will never say they are there.
   */
  if (transport_pending (&c->session.transport))
    mark_ready (c);
}

static void
conn_free (struct conn *c)
{
  struct mloop_stats *st = c->set->opts->stats;
  unsigned i;

  MLOOP_STATS_SUB (st, connections, 1);

  epoll_ctl (c->set->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  for (i = 0; i < c->fresh; i++)
    if (!buffer_is_ours (c, &c->slots[i]))
      splice_out_forget (c->slots[i].buf, c->slots[i].cap);
  free_returned_lent (c, 0, true);
  splice_out_close (&c->splice);
  transport_close (&c->session.transport);
  worker_close_client (c->set->opts, c->fd);
  /* Every buffer a slot has is charged to the server: its request's, or
   * kept.
   */
  for (i = 0; i < c->fresh; i++) {
    budget_release (c->set->opts->budget, c->slots[i].cap);
    mloop_free_aligned (c->slots[i].buf, c->slots[i].cap);
  }
  c->set->heap_used = true;
  if (c->budget_wait)
    c->set->budget_waiters--;
  free (c->in);
  free (c);
}

void
conn_set_refuse_buffered (struct conn_set *s)
{
  struct conn *c;

  for (c = s->all; c; c = c->next) {
    /* One pass over what the socket holds now: validate_and_dispatch()
     * answers every complete request with ESHUTDOWN (a write's payload
     * is read and dropped), so a client learns the fate of what it sent.
     */
    conn_read (c);
    if (c->receiving) {
      /* A WRITE whose payload never fully arrived: nothing to answer. */
      release_slot (c, c->receiving);
      c->receiving = NULL;
    }
    c->closing = true;
    conn_update_events (c);
  }
}

unsigned
conn_set_break_all (struct conn_set *s)
{
  unsigned losing = 0;
  struct conn *c;

  for (c = s->all; c; c = c->next) {
    if (c->out_head || c->in_kernel || c->in_helpers)
      losing++;
    conn_break (c);
  }
  return losing;
}

void
conn_set_free_closed (struct conn_set *s)
{
  struct conn **p = &s->all;

  while (*p) {
    struct conn *c = *p;

    if (c->closing && c->in_kernel == 0 && c->in_helpers == 0 &&
        !c->receiving &&
        (c->broken || !c->out_head) && !c->on_ready && !c->dirty) {
      *p = c->next;
      conn_free (c);
    }
    else
      p = &c->next;
  }
}

void
conn_set_free_returned (struct conn_set *s)
{
  struct conn *c;

  for (c = s->all; c; c = c->next)
    free_returned_lent (c, 0, false);
}

void
conn_set_free_kept (struct conn_set *s)
{
  struct budget *b = s->opts->budget;

  for (struct conn *c = s->all; c; c = c->next)
    for (unsigned i = 0; i < c->fresh && c->kept > 0; i++) {
      struct request *req = &c->slots[i];

      /* In flight (charged), none, or still lent to the socket. */
      if (req->charged || req->buf == NULL || !buffer_is_ours (c, req))
        continue;
      c->kept -= req->cap;
      budget_release (b, req->cap);
      mloop_free_aligned (req->buf, req->cap);
      req->buf = NULL;
      req->cap = 0;
    }
}

bool
conn_set_has_work (const struct conn_set *s)
{
  return s->ready || s->dirty;
}
