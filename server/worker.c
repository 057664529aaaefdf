/* mloop-server — event-loop workers.  See worker.h for the model. */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "aio_ring.h"
#include "align.h"
#include "connection.h"
#include "nbd_proto.h"
#include "request.h"
#include "space.h"
#include "memory_pressure.h"
#include "worker.h"

#define EPOLL_BATCH   64
#define REAP_BATCH    256
#define SEND_IOVECS   128
#define SEND_BUFFER   (4 << 20)
/* How often a connection waiting for the server's budget looks again:
 * other workers free it without telling us, and waiting is rare.
 */
#define BUDGET_RETRY_MS 10

struct worker {
  struct worker_options opts;
  pthread_t thread;
  int epfd;
  int aio_efd;                  /* signalled by the kernel per completion */
  int inbox_efd;                /* new connections, or stop */
  struct mloop_aio_ring ring;
  unsigned in_kernel;           /* requests submitted, not reaped */
  unsigned in_helpers;          /* requests offloaded, not yet back */
  unsigned budget_waiters;      /* connections paused on the budget */
  struct offload_inbox done;    /* offloaded requests coming back */

  struct iocb **batch;          /* prepared, not yet submitted */
  unsigned batch_len;

  pthread_mutex_t inbox_lock;   /* guards inbox and stopping */
  int *inbox;
  size_t inbox_len, inbox_cap;
  atomic_bool stopping;

  struct conn *conns;
  struct conn *dirty;           /* connections with replies to send */
  /* Connections that may read again and hold unparsed bytes: epoll would
   * not wake us for data that has already left the socket.
   */
  struct conn *ready;
};

/* epoll data for the worker's own descriptors (connections use their
 * struct conn pointer).
 */
static char aio_tag, inbox_tag, done_tag;

/* ------------------------------------------------------------ epoll */

static void
conn_update_events (struct conn *c)
{
  struct epoll_event ev = { 0 };

  if (c->broken) {
    /* Nothing more to read or send: stop hearing about this socket. */
    epoll_ctl (c->worker->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    return;
  }
  if (!c->reading_paused && !c->closing)
    ev.events |= EPOLLIN;
  if (c->want_write)
    ev.events |= EPOLLOUT;
  ev.data.ptr = c;
  epoll_ctl (c->worker->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* ------------------------------------------------------------ replies */

static void
mark_dirty (struct conn *c)
{
  if (!c->dirty) {
    c->dirty = true;
    c->next_dirty = c->worker->dirty;
    c->worker->dirty = c;
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

/* Queues REQ's reply (header, and data for a successful READ). */
static void
queue_reply (struct request *req, uint32_t nbd_error)
{
  struct conn *c = req->conn;

  count_reply (c->worker->opts.stats, req, nbd_error);
  TRACE_REQUEST (MLOOP_TRACE_COMPLETE, req, (int) nbd_error);

  req->error = nbd_error;
  req->reply.magic = htobe32 (NBD_SIMPLE_REPLY_MAGIC);
  req->reply.error = htobe32 (nbd_error);
  req->data_len = (req->type == NBD_CMD_READ && nbd_error == 0)
    ? req->io.count : 0;
  req->next = NULL;
  if (c->out_tail)
    c->out_tail->next = req;
  else
    c->out_head = req;
  c->out_tail = req;
  mark_dirty (c);
}

/* Lets C read again after a pause for lack of a slot or of ring room. */
static void
resume_reading (struct conn *c)
{
  if (c->budget_wait) {
    c->budget_wait = false;
    c->worker->budget_waiters--;
  }
  c->reading_paused = false;
  conn_update_events (c);
  if (!c->on_ready && (c->in_end > c->in_start || c->receiving)) {
    c->on_ready = true;
    c->next_ready = c->worker->ready;
    c->worker->ready = c;
  }
}

/* Gives REQ's buffer back: uncharged, then kept for the slot's next
 * request if small and the connection keeps little, else freed.
 */
static void
release_buffer (struct conn *c, struct request *req)
{
  if (!req->charged)
    return;                     /* none, or already kept */
  req->charged = false;
  c->held -= req->cap;
  budget_release (c->worker->opts.budget, req->cap);
  if (req->cap <= MLOOP_KEEP_BUFFER &&
      c->kept + req->cap <= BUDGET_KEEP_PER_CONN)
    c->kept += req->cap;
  else {
    mloop_free_aligned (req->buf, req->cap);
    req->buf = NULL;
    req->cap = 0;
  }
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

/* Sends as much of the reply queue as the socket takes, with one
 * sendmsg per SEND_IOVECS pieces.
 */
static void
conn_flush (struct conn *c)
{
  while (c->out_head && !c->broken) {
    struct iovec iov[SEND_IOVECS];
    struct msghdr msg = { .msg_iov = iov };
    struct request *req = c->out_head;
    size_t skip = c->out_sent;
    int n = 0;
    ssize_t sent;

    for (; req && n + 2 <= SEND_IOVECS; req = req->next) {
      size_t hlen = sizeof req->reply;

      if (skip < hlen) {
        iov[n].iov_base = (char *) &req->reply + skip;
        iov[n++].iov_len = hlen - skip;
        skip = 0;
      }
      else
        skip -= hlen;
      if (req->data_len > skip) {
        iov[n].iov_base = (char *) req->buf + skip;
        iov[n++].iov_len = req->data_len - skip;
      }
      skip = 0;
    }
    msg.msg_iovlen = (size_t) n;
    sent = sendmsg (c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent == -1 && errno == EINTR)
      continue;
    if (sent == -1 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!c->want_write) {
        c->want_write = true;
        conn_update_events (c);
      }
      return;
    }
    if (sent == -1) {
      c->broken = c->closing = true;   /* the client went away */
      break;
    }
    /* Retire the replies sent in full. */
    c->out_sent += (size_t) sent;
    while (c->out_head) {
      struct request *head = c->out_head;
      size_t whole = sizeof head->reply + head->data_len;

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
  if (c->want_write && !c->out_head) {
    c->want_write = false;
    conn_update_events (c);
  }
}

/* ------------------------------------------------------------ IO */

static const char *
command_name (uint16_t type)
{
  switch (type) {
  case NBD_CMD_READ: return "read";
  case NBD_CMD_WRITE: return "write";
  case NBD_CMD_FLUSH: return "flush";
  case NBD_CMD_TRIM: return "trim";
  case NBD_CMD_WRITE_ZEROES: return "zero";
  default: return "command";
  }
}

/* One log line per failed IO, naming the request (a refused fast zero
 * is an expected answer, not an error).
 */
static void
log_io_error (const struct request *req, uint64_t offset, uint64_t length,
              int error)
{
  if (error == ENOTSUP && req->type == NBD_CMD_WRITE_ZEROES)
    return;
  fprintf (stderr, "mloop-server: error: %s: %" PRIu64 " bytes at offset %"
           PRIu64 ": %s\n", command_name (req->type), length, offset,
           strerror (error));
}

static void
io_complete (struct mloop_io *io, int error)
{
  struct request *req = (struct request *) io;

  if (error)
    log_io_error (req, io->offset, io->count, error);
  queue_reply (req, nbd_errno (error));
}

static void
add_to_batch (struct worker *w, struct request *req)
{
  io_set_eventfd (&req->io.iocb, w->aio_efd);
  w->batch[w->batch_len++] = &req->io.iocb;
  req->conn->in_kernel++;
  w->in_kernel++;
}

static void
submit_batch (struct worker *w)
{
  unsigned done = 0;

  while (done < w->batch_len) {
    int r = mloop_aio_ring_submit (&w->ring, w->batch + done,
                                   (int) (w->batch_len - done));

    if (r > 0) {
      for (int i = 0; i < r; i++)
        TRACE_REQUEST (MLOOP_TRACE_SUBMIT,
                       (struct request *) w->batch[done + i]->data, 0);
      done += (unsigned) r;
      continue;
    }
    /* The kernel refused the next iocb: fail that request alone. */
    {
      struct request *req = (struct request *) w->batch[done]->data;

      req->conn->in_kernel--;
      w->in_kernel--;
      if (mloop_engine_complete_event (w->opts.engine, &req->io, r)
          != MLOOP_EVENT_DONE)
        queue_reply (req, NBD_EIO);
      done++;
    }
  }
  w->batch_len = 0;
}

static void
reap (struct worker *w)
{
  struct io_event events[REAP_BATCH];
  uint64_t count;
  int n, i;

  /* Reset the eventfd before reaping, so a completion racing with us
   * signals it again rather than being missed.
   */
  if (read (w->aio_efd, &count, sizeof count) == -1 && errno != EAGAIN)
    return;
  do {
    n = mloop_aio_ring_reap (&w->ring, 0, events, REAP_BATCH, NULL);
    for (i = 0; i < n; i++) {
      struct request *req = events[i].data;

      req->conn->in_kernel--;
      w->in_kernel--;
      if (mloop_engine_complete_event (w->opts.engine, &req->io,
                                       (long) events[i].res)
          == MLOOP_EVENT_RESUBMIT)
        add_to_batch (w, req);
    }
  } while (n == REAP_BATCH);
  if (w->batch_len)
    submit_batch (w);           /* short-transfer resubmissions */
}

/* Gives REQ an aligned buffer of at least N bytes, charged to the
 * budget: the slot's kept buffer if big enough, else a new one.
 */
static int
ensure_buffer (struct conn *c, struct request *req, size_t n, uint32_t align)
{
  if (req->buf && !req->charged)
    c->kept -= req->cap;        /* leaves the kept pool either way */
  if (req->cap < n || req->buf == NULL) {
    mloop_free_aligned (req->buf, req->cap);
    req->buf = mloop_alloc_aligned (n, align);
    req->cap = req->buf ? n : 0;
    if (req->buf == NULL)
      return -1;
  }
  req->charged = true;
  c->held += req->cap;
  budget_charge (c->worker->opts.budget, req->cap);
  return 0;
}

/* ------------------------------------------------------------ helpers */

/* On a helper thread: the request's blocking work.  Reads only what the
 * worker set before handing it over, and the engine.
 */
static void
run_blocking (struct offload_job *job)
{
  struct request *req = (struct request *)
    ((char *) job - offsetof (struct request, job));
  struct mloop_engine *e = req->conn->worker->opts.engine;
  struct mloop_io *io = &req->io;

  switch (req->type) {
  case NBD_CMD_TRIM:
    req->result = mloop_engine_trim (e, io->offset, io->count, io->flags);
    break;
  case NBD_CMD_WRITE_ZEROES:
    req->result = mloop_engine_zero (e, io->offset, io->count, io->flags);
    break;
  default:                      /* READ, WRITE or FLUSH the engine
                                   said must block */
    req->result = mloop_engine_perform_blocking (e, io);
    break;
  }
}

static void
offload_request (struct worker *w, struct request *req)
{
  req->job.run = run_blocking;
  req->job.home = &w->done;
  req->conn->in_helpers++;
  w->in_helpers++;
  offload_submit (w->opts.offload, &req->job);
}

/* Back on the worker: reply to what the helpers finished. */
static void
take_done (struct worker *w)
{
  struct offload_job *job = offload_inbox_take (&w->done);

  while (job) {
    struct request *req = (struct request *)
      ((char *) job - offsetof (struct request, job));
    struct mloop_io *io = &req->io;
    int r = req->result;

    job = job->next;
    req->conn->in_helpers--;
    w->in_helpers--;
    switch (req->type) {
    case NBD_CMD_TRIM:
    case NBD_CMD_WRITE_ZEROES:
      if (r < 0 && r != -EINVAL && r != -EPERM && r != -ENOSPC)
        log_io_error (req, io->offset, io->count, -r);
      queue_reply (req, nbd_errno (-r));
      break;
    default:
      mloop_engine_complete_blocking (w->opts.engine, io, r);
      break;
    }
  }
}

/* Sends READ/WRITE/FLUSH to the engine. */
static void
start_io (struct worker *w, struct request *req, enum mloop_io_op op,
          unsigned flags, uint64_t offset, uint32_t length)
{
  struct mloop_io *io = &req->io;
  int r;

  memset (io, 0, sizeof *io);
  io->op = op;
  io->flags = flags;
  io->buf = req->buf;
  io->count = length;
  io->offset = offset;
  io->complete = io_complete;
  io->opaque = req;
  r = mloop_engine_prepare (w->opts.engine, io);
  if (r == MLOOP_PREPARED_AIO)
    add_to_batch (w, req);
  else if (r == MLOOP_PREPARED_BLOCKING)
    offload_request (w, req);
  else if (r < 0)
    queue_reply (req, nbd_errno (-r));
  /* MLOOP_PREPARED_DONE: completed already, reply queued. */
}

/* ------------------------------------------------------------ requests */

/* The export's properties request_admit() and request_check() decide by. */
static struct request_limits
limits (const struct worker *w)
{
  return (struct request_limits) {
    .size = w->opts.engine->backing.size,
    .read_only = w->opts.read_only,
    .discard = w->opts.discard,
    .max_request = w->opts.max_request,
  };
}

/* Validates and performs one request whose header (and, for a WRITE, its
 * payload) has been received.  Every check happens before any IO.
 */
static void
dispatch (struct worker *w, struct request *req, uint64_t offset,
          uint32_t length)
{
  const struct request_limits x = limits (w);
  const struct nbd_request h = {
    .magic = NBD_REQUEST_MAGIC, .flags = req->flags, .type = req->type,
    .offset = offset, .length = length,
  };
  const uint16_t f = req->flags;
  unsigned io_flags = (f & NBD_CMD_FLAG_FUA) ? MLOOP_IO_FUA : 0;
  uint32_t error;

  if (atomic_load (&w->stopping)) {
    queue_reply (req, NBD_ESHUTDOWN);
    return;
  }
  if (request_check (&h, &x, &error) == REQUEST_REPLY) {
    queue_reply (req, error);
    return;
  }
  switch (req->type) {
  case NBD_CMD_READ:
    start_io (w, req, MLOOP_IO_READ, 0, offset, length);
    return;
  case NBD_CMD_WRITE:
    start_io (w, req, MLOOP_IO_WRITE, io_flags, offset, length);
    return;
  case NBD_CMD_FLUSH:
    /* Every write replied to before this flush arrived has completed
     * (replies are sent from completions), so the fdatasync covers
     * exactly what NBD requires, without waiting for anything else.
     */
    start_io (w, req, MLOOP_IO_FLUSH, 0, 0, 0);
    return;
  case NBD_CMD_TRIM:
  case NBD_CMD_WRITE_ZEROES:
    /* fallocate and the block ioctls can take seconds: a helper runs
     * them while this loop serves everyone else.
     */
    if (f & NBD_CMD_FLAG_NO_HOLE)
      io_flags |= MLOOP_ZERO_NO_HOLE;
    if (f & NBD_CMD_FLAG_FAST_ZERO)
      io_flags |= MLOOP_ZERO_FAST;
    req->io.offset = offset;
    req->io.count = length;
    req->io.flags = io_flags;
    offload_request (w, req);
    return;
  default:
    queue_reply (req, NBD_EINVAL);   /* request_check() refused it */
    return;
  }
}

static void
conn_close_when_idle (struct conn *c)
{
  c->closing = true;
  conn_update_events (c);
}

/* Parses one request header at c->in + c->in_start.  Returns false when
 * the connection must stop reading (closing).
 */
static bool
parse_header (struct worker *w, struct conn *c)
{
  const struct request_limits x = limits (w);
  struct nbd_request h;
  struct request *req;
  enum request_verdict v;
  uint32_t error;
  uint64_t offset;
  uint32_t length;
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

  req = c->free;
  c->free = req->next;
  c->busy++;
  MLOOP_STATS_ADD (w->opts.stats, in_flight, 1);
  req->conn = c;
  req->type = type;
  req->flags = h.flags;
  memcpy (req->reply.cookie, h.cookie, 8);
  req->data_len = 0;

  if (v == REQUEST_REPLY) {     /* an oversized read */
    queue_reply (req, error);
    return true;
  }
  if ((type == NBD_CMD_READ || type == NBD_CMD_WRITE) && length > 0 &&
      ensure_buffer (c, req, length,
                     w->opts.engine->backing.logical_block_size) == -1) {
    if (type == NBD_CMD_WRITE) {
      conn_close_when_idle (c);
      MLOOP_STATS_SUB (w->opts.stats, in_flight, 1);     /* never answered */
      release_slot (c, req);
      return false;
    }
    queue_reply (req, NBD_ENOMEM);
    return true;
  }
  req->io.offset = offset;      /* kept until the payload is in */
  req->io.count = length;
  if (type == NBD_CMD_WRITE && length > 0) {
    c->receiving = req;
    c->payload_done = 0;
    return true;
  }
  dispatch (w, req, offset, length);
  return true;
}

/* Moves payload bytes for the WRITE being received; returns true once it
 * is complete (and dispatched).
 */
static bool
receive_payload (struct worker *w, struct conn *c)
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
    ssize_t r = recv (c->fd, (char *) req->buf + c->payload_done, need,
                      MSG_DONTWAIT);

    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return false;
    if (r <= 0) {
      c->closing = c->broken = true;
      c->receiving = NULL;
      MLOOP_STATS_SUB (w->opts.stats, in_flight, 1);     /* never answered */
      release_slot (c, req);
      return false;
    }
    c->payload_done += (size_t) r;
    need -= (size_t) r;
  }
  c->receiving = NULL;
  dispatch (w, req, req->io.offset, (uint32_t) req->io.count);
  return true;
}

/* Bytes of buffer the request at the head of C's input will need. */
static uint32_t
buffer_need (const struct worker *w, const struct conn *c)
{
  struct nbd_request h;

  request_decode (c->in + c->in_start, &h);
  if (h.magic != NBD_REQUEST_MAGIC ||
      (h.type != NBD_CMD_READ && h.type != NBD_CMD_WRITE) ||
      h.length > w->opts.max_request)
    return 0;                   /* refused or closed: no buffer */
  return h.length;
}

/* Whether the next request of C fits the budget (budget.h); notes what
 * it needs for a later look.
 */
static bool
budget_allows_next (struct worker *w, struct conn *c)
{
  c->budget_need = buffer_need (w, c);
  return c->budget_need == 0 ||
    budget_may_take (w->opts.budget, c->held, c->budget_need);
}

/* Stops reading C until its replies drain (release_slot resumes it) or
 * the server's budget has room again (worker_main looks).
 */
static void
pause_for_budget (struct conn *c)
{
  c->reading_paused = true;
  if (!c->budget_wait) {
    c->budget_wait = true;
    c->worker->budget_waiters++;
  }
  conn_update_events (c);
}

/* Resumes connections whose budget wait is over. */
static void
retry_budget_waiters (struct worker *w)
{
  struct conn *c;

  for (c = w->conns; c && w->budget_waiters; c = c->next)
    if (c->budget_wait && !c->closing &&
        budget_may_take (w->opts.budget, c->held, c->budget_need))
      resume_reading (c);
}

/* Reads and handles every request available on C. */
static void
conn_read (struct worker *w, struct conn *c)
{
  while (!c->closing) {
    if (c->receiving) {
      if (!receive_payload (w, c))
        return;
      continue;
    }
    if (c->in_end - c->in_start >= NBD_REQUEST_SIZE) {
      if (!c->free ||
          w->in_kernel + w->batch_len >= w->opts.ring_depth) {
        c->reading_paused = true;
        conn_update_events (c);
        return;
      }
      if (!budget_allows_next (w, c)) {
        pause_for_budget (c);
        return;
      }
      parse_header (w, c);
      continue;
    }
    /* Need more bytes: compact, then one recv for as much as is there. */
    memmove (c->in, c->in + c->in_start, c->in_end - c->in_start);
    c->in_end -= c->in_start;
    c->in_start = 0;
    {
      ssize_t r = recv (c->fd, c->in + c->in_end, CONN_INBUF - c->in_end,
                        MSG_DONTWAIT);

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

/* ------------------------------------------------------------ lifecycle */

static void
conn_free (struct conn *c)
{
  struct mloop_stats *st = c->worker->opts.stats;
  unsigned i;

  MLOOP_STATS_SUB (st, connections, 1);

  epoll_ctl (c->worker->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close (c->fd);
  for (i = 0; i < CONN_SLOTS; i++) {
    if (c->slots[i].charged)
      budget_release (c->worker->opts.budget, c->slots[i].cap);
    mloop_free_aligned (c->slots[i].buf, c->slots[i].cap);
  }
  if (c->budget_wait)
    c->worker->budget_waiters--;
  free (c->in);
  free (c);
}

static void
adopt (struct worker *w, int fd)
{
  struct conn *c = calloc (1, sizeof *c);
  struct epoll_event ev = { .events = EPOLLIN };
  unsigned i;

  if (c)
    c->in = malloc (CONN_INBUF);
  if (c == NULL || c->in == NULL) {
    free (c);
    close (fd);
    return;
  }
  c->fd = fd;
  c->worker = w;
  /* Room for several 1 MiB read replies in the socket, so one sendmsg
   * carries them instead of a wake-up per ~200 KiB of the default buffer.
   * Best effort: the kernel caps it at net.core.wmem_max.
   */
  setsockopt (fd, SOL_SOCKET, SO_SNDBUF, &(int) { SEND_BUFFER }, sizeof (int));
  for (i = 0; i < CONN_SLOTS; i++) {
    c->slots[i].next = c->free;
    c->free = &c->slots[i];
  }
  ev.data.ptr = c;
  if (epoll_ctl (w->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
    free (c->in);
    free (c);
    close (fd);
    return;
  }
  c->next = w->conns;
  w->conns = c;
  MLOOP_STATS_ADD (w->opts.stats, connections, 1);
  MLOOP_STATS_ADD (w->opts.stats, connections_total, 1);
}

static void
take_inbox (struct worker *w)
{
  uint64_t v;
  size_t i;

  if (read (w->inbox_efd, &v, sizeof v) == -1 && errno != EAGAIN)
    return;
  pthread_mutex_lock (&w->inbox_lock);
  for (i = 0; i < w->inbox_len; i++)
    adopt (w, w->inbox[i]);
  w->inbox_len = 0;
  pthread_mutex_unlock (&w->inbox_lock);
}

/* On shutdown: answer requests already sent to us with ESHUTDOWN, then
 * read no more.
 */
static void
refuse_buffered (struct worker *w, struct conn *c)
{
  /* One pass over what the socket holds now: dispatch() answers every
   * complete request with ESHUTDOWN (a write's payload is read and
   * dropped), so a client learns the fate of what it sent.
   */
  conn_read (w, c);
  if (c->receiving) {
    /* A WRITE whose payload never fully arrived: nothing to answer. */
    release_slot (c, c->receiving);
    c->receiving = NULL;
  }
  c->closing = true;
  conn_update_events (c);
}

/* Frees connections that are closing with nothing left in flight. */
static void
reap_connections (struct worker *w)
{
  struct conn **p = &w->conns;

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

static int64_t
now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* At the drain deadline: replies still unsent (their client does not
 * read them) are dropped, so the worker can close and exit.  IO still in
 * the kernel or with a helper is waited for, since it uses our buffers.
 */
static void
drop_unsent_replies (struct worker *w)
{
  unsigned dropped = 0;
  struct conn *c;

  for (c = w->conns; c; c = c->next) {
    if (c->out_head || c->in_kernel || c->in_helpers)
      dropped++;
    if (!c->broken) {
      c->broken = c->closing = true;
      conn_update_events (c);
      mark_dirty (c);           /* conn_flush drops the queue */
    }
  }
  if (dropped)
    fprintf (stderr, "mloop-server: drain timeout (%u s): dropping the "
             "replies of %u connection(s)\n", w->opts.drain_timeout, dropped);
}

/* How long epoll_wait may sleep, in ms (-1: until something happens). */
static int
sleep_budget (const struct worker *w, bool shutdown_seen, bool drained,
              int64_t deadline)
{
  int ms = -1;

  if (w->ready || w->dirty)
    return 0;                   /* never sleep with work in hand */
  if (w->budget_waiters)
    ms = BUDGET_RETRY_MS;
  if (shutdown_seen && !drained) {
    int64_t left = deadline - now_ms ();

    if (left < 0)
      left = 0;
    if (ms == -1 || left < ms)
      ms = (int) left;
  }
  return ms;
}

static void *
worker_main (void *arg)
{
  struct worker *w = arg;
  struct epoll_event evs[EPOLL_BATCH];
  bool shutdown_seen = false, drained = false;
  int64_t deadline = 0;

  /* This thread does the device's IO: keep it out of reclaim. */
  mloop_io_flusher_thread ();

  for (;;) {
    int n, i;
    bool completions = false;

    mloop_trace_flush ();
    n = epoll_wait (w->epfd, evs, EPOLL_BATCH,
                    sleep_budget (w, shutdown_seen, drained, deadline));
    if (n == -1 && errno != EINTR)
      break;
    if (n == -1)
      n = 0;
    while (w->ready) {
      struct conn *c = w->ready;

      w->ready = c->next_ready;
      c->on_ready = false;
      if (!atomic_load (&w->stopping))
        conn_read (w, c);
    }
    for (i = 0; i < n; i++) {
      void *tag = evs[i].data.ptr;

      if (tag == &aio_tag)
        completions = true;
      else if (tag == &inbox_tag)
        take_inbox (w);
      else if (tag == &done_tag)
        take_done (w);
      else {
        struct conn *c = tag;

        if ((evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) &&
            !atomic_load (&w->stopping))
          conn_read (w, c);
        if ((evs[i].events & (EPOLLHUP | EPOLLERR)) && !c->broken) {
          /* Peer gone both ways: replies cannot be delivered. */
          c->broken = c->closing = true;
          conn_update_events (c);
          mark_dirty (c);       /* conn_flush drops the queue */
        }
        if (evs[i].events & EPOLLOUT)
          mark_dirty (c);
      }
    }
    if (atomic_load (&w->stopping) && !shutdown_seen) {
      struct conn *c;

      shutdown_seen = true;
      deadline = now_ms () + (int64_t) w->opts.drain_timeout * 1000;
      for (c = w->conns; c; c = c->next)
        refuse_buffered (w, c);
    }
    if (shutdown_seen && !drained && now_ms () >= deadline) {
      drained = true;
      drop_unsent_replies (w);
    }
    /* One io_submit for everything this round read. */
    if (w->batch_len)
      submit_batch (w);
    if (completions) {
      struct conn *c;

      reap (w);
      /* Ring room may have freed up for connections paused on it. */
      for (c = w->conns; c; c = c->next)
        if (c->reading_paused && !c->budget_wait && c->free && !c->closing)
          resume_reading (c);
    }
    if (w->budget_waiters)
      retry_budget_waiters (w);
    /* One sendmsg per connection for all its finished replies. */
    while (w->dirty) {
      struct conn *c = w->dirty;

      w->dirty = c->next_dirty;
      c->dirty = false;
      conn_flush (c);
    }
    reap_connections (w);
    if (shutdown_seen && w->conns == NULL && w->in_kernel == 0 &&
        w->in_helpers == 0)
      break;
  }
  return NULL;
}

/* ------------------------------------------------------------ public */

static int
epoll_add_tag (int epfd, int fd, void *tag)
{
  struct epoll_event ev = { .events = EPOLLIN, .data.ptr = tag };

  return epoll_ctl (epfd, EPOLL_CTL_ADD, fd, &ev);
}

struct worker *
worker_start (const struct worker_options *opts, char *err, size_t errlen)
{
  struct worker *w = calloc (1, sizeof *w);
  int r;

  if (w == NULL) {
    snprintf (err, errlen, "worker: %s", strerror (errno));
    return NULL;
  }
  w->opts = *opts;
  w->epfd = w->aio_efd = w->inbox_efd = w->done.efd = -1;
  pthread_mutex_init (&w->inbox_lock, NULL);
  atomic_init (&w->stopping, false);
  w->batch = calloc (opts->ring_depth + CONN_SLOTS, sizeof *w->batch);
  if (w->batch == NULL)
    goto errno_fail;
  w->epfd = epoll_create1 (EPOLL_CLOEXEC);
  w->aio_efd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  w->inbox_efd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (w->epfd == -1 || w->aio_efd == -1 || w->inbox_efd == -1 ||
      offload_inbox_init (&w->done) == -1 ||
      epoll_add_tag (w->epfd, w->aio_efd, &aio_tag) == -1 ||
      epoll_add_tag (w->epfd, w->inbox_efd, &inbox_tag) == -1 ||
      epoll_add_tag (w->epfd, w->done.efd, &done_tag) == -1)
    goto errno_fail;
  /* Room for a full round of resubmissions beyond the depth limit. */
  r = mloop_aio_ring_init (&w->ring, opts->ring_depth + CONN_SLOTS);
  if (r < 0) {
    errno = -r;
    goto errno_fail;
  }
  r = pthread_create (&w->thread, NULL, worker_main, w);
  if (r != 0) {
    errno = r;
    mloop_aio_ring_destroy (&w->ring);
    goto errno_fail;
  }
  return w;

 errno_fail:
  snprintf (err, errlen, "starting a worker: %s", strerror (errno));
  if (w->epfd >= 0) close (w->epfd);
  if (w->aio_efd >= 0) close (w->aio_efd);
  if (w->inbox_efd >= 0) close (w->inbox_efd);
  offload_inbox_destroy (&w->done);
  free (w->batch);
  free (w);
  return NULL;
}

static void
poke (struct worker *w)
{
  uint64_t one = 1;

  if (write (w->inbox_efd, &one, sizeof one) != sizeof one)
    abort ();                   /* an eventfd write cannot fail here */
}

void
worker_add_connection (struct worker *w, int fd)
{
  pthread_mutex_lock (&w->inbox_lock);
  if (w->inbox_len == w->inbox_cap) {
    size_t cap = w->inbox_cap ? 2 * w->inbox_cap : 16;
    int *p = realloc (w->inbox, cap * sizeof *p);

    if (p == NULL) {
      pthread_mutex_unlock (&w->inbox_lock);
      close (fd);
      return;
    }
    w->inbox = p;
    w->inbox_cap = cap;
  }
  w->inbox[w->inbox_len++] = fd;
  pthread_mutex_unlock (&w->inbox_lock);
  poke (w);
}

void
worker_begin_stop (struct worker *w)
{
  if (!atomic_exchange (&w->stopping, true))
    poke (w);
}

void
worker_stop (struct worker *w)
{
  size_t i;

  worker_begin_stop (w);
  pthread_join (w->thread, NULL);
  for (i = 0; i < w->inbox_len; i++)
    close (w->inbox[i]);
  free (w->inbox);
  mloop_aio_ring_destroy (&w->ring);
  close (w->epfd);
  close (w->aio_efd);
  close (w->inbox_efd);
  offload_inbox_destroy (&w->done);
  pthread_mutex_destroy (&w->inbox_lock);
  free (w->batch);
  free (w);
}
