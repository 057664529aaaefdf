/* mloop-server — a validated request on its way through the engine: the
 * AIO batch, the reaping of completions, the helpers for what must block,
 * and the reply each of them ends in.  See dispatch.h.
 */
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/eventfd.h>

#include "clock.h"
#include "conn.h"
#include "dispatch.h"
#include "log_limit.h"
#include "nbd_proto.h"
#include "space.h"

/* Completions taken per io_getevents. */
#define REAP_BATCH 256

static const char *
command_name (uint16_t type)
{
  switch (type) {
  case NBD_CMD_READ: return "read";
  case NBD_CMD_WRITE: return "write";
  case NBD_CMD_FLUSH: return "flush";
  case NBD_CMD_TRIM: return "trim";
  case NBD_CMD_WRITE_ZEROES: return "zero";
  case NBD_CMD_BLOCK_STATUS: return "block status";
  default: return "command";
  }
}

/* A log line per failed IO, naming the request, under the bound on
 * repeated lines: a client can make every request fail (a read past the
 * end of an image shrunk under it).  A refused fast zero is an expected
 * answer, not an error.
 */
static void
log_io_error (const struct request *req, uint64_t offset, uint64_t length,
              int error)
{
  if (error == ENOTSUP && req->type == NBD_CMD_WRITE_ZEROES)
    return;
  log_limited ("error: %s: %" PRIu64 " bytes at offset %" PRIu64 ": %s",
               command_name (req->type), length, offset, strerror (error));
}

/* The engine's completion of READ, WRITE and FLUSH, however they ran. */
static void
io_complete (struct mloop_io *io, int error)
{
  struct request *req = (struct request *) io;

  if (error)
    log_io_error (req, io->offset, io->count, error);
  conn_queue_reply (req, nbd_errno (error));
}

/* ------------------------------------------------------------ AIO */

/* After the limit refused a context, how long before asking again. */
#define RING_RETRY_MS 1000

/* Says once per process that the system-wide AIO limit (or another
 * io_setup failure) held a worker back: the server goes on serving, with
 * smaller contexts or through the helpers.
 */
static void
log_ring_shortage (int error, unsigned want)
{
  static atomic_bool logged;
  char why[256];

  if (atomic_exchange (&logged, true))
    return;
  if (error == EAGAIN)
    mloop_aio_limit_message (why, sizeof why, want);
  else
    snprintf (why, sizeof why, "io_setup(%u): %s", want, strerror (error));
  fprintf (stderr, "mloop-server: warning: %s; serving with smaller AIO "
           "contexts meanwhile\n", why);
}

/* The first request: opens the context, as deep as D->depth if the
 * limit allows, else as deep as it does (at least the floor).
 */
static void
open_ring (struct dispatch *d)
{
  bool limited;
  int r;

  if (d->retry_ms && server_now_ms () < d->retry_ms)
    return;
  r = mloop_aio_ring_init_fit (&d->ring, d->depth, MLOOP_AIO_RING_FLOOR,
                               &limited);
  if (limited || r < 0)
    log_ring_shortage (r < 0 ? -r : EAGAIN, d->depth);
  if (r > 0) {
    d->depth = (unsigned) r;
    d->retry_ms = 0;
  }
  else
    d->retry_ms = server_now_ms () + RING_RETRY_MS;
}

/* A full context: replaces it with one twice as deep, up to
 * --queue-depth.  What the old one holds is reaped from it until it is
 * empty (only then may it grow again).  Without the room, stays as it
 * is and asks again later.
 */
static bool
grow_ring (struct dispatch *d)
{
  struct mloop_aio_ring bigger;
  unsigned want;
  int r;

  if (d->depth >= d->ring_depth || d->old.ctx)
    return false;
  want = d->depth * 2 < d->ring_depth ? d->depth * 2 : d->ring_depth;
  if (d->ring.ctx == 0) {
    d->depth = want;            /* not opened yet: open it deeper */
    return true;
  }
  if (d->retry_ms && server_now_ms () < d->retry_ms)
    return false;
  r = mloop_aio_ring_init (&bigger, want);
  if (r < 0) {
    log_ring_shortage (-r, want);
    d->retry_ms = server_now_ms () + RING_RETRY_MS;
    return false;
  }
  d->retry_ms = 0;
  if (d->ring_in_flight) {
    d->old = d->ring;
    d->old_in_flight = d->ring_in_flight;
  }
  else
    mloop_aio_ring_destroy (&d->ring);
  d->ring = bigger;
  d->ring_in_flight = 0;
  d->depth = want;
  return true;
}

static void
add_to_batch (struct dispatch *d, struct request *req)
{
  io_set_eventfd (&req->io.iocb, d->aio_efd);
  d->batch[d->batch_len++] = &req->io.iocb;
  req->conn->in_kernel++;
  d->in_kernel++;
}

static void perform_on_helper (struct dispatch *d, struct request *req);

static void
submit_batch (struct dispatch *d)
{
  unsigned done = 0, room;

  if (d->ring.ctx == 0)
    open_ring (d);
  room = d->ring.ctx ? d->ring.depth - d->ring_in_flight : 0;
  while (done < d->batch_len && room > 0) {
    unsigned n = d->batch_len - done < room ? d->batch_len - done : room;
    int r = mloop_aio_ring_submit (&d->ring, d->batch + done, (int) n);

    if (r > 0) {
      for (int i = 0; i < r; i++)
        TRACE_REQUEST (MLOOP_TRACE_SUBMIT,
                       (struct request *) d->batch[done + i]->data, 0);
      done += (unsigned) r;
      room -= (unsigned) r;
      d->ring_in_flight += (unsigned) r;
      continue;
    }
    /* The kernel refused the next iocb: fail that request alone. */
    {
      struct request *req = (struct request *) d->batch[done]->data;

      req->conn->in_kernel--;
      d->in_kernel--;
      if (mloop_engine_complete_event (d->engine, &req->io, r)
          != MLOOP_EVENT_DONE)
        conn_queue_reply (req, NBD_EIO);
      done++;
    }
  }
  /* No context, or one smaller than what was admitted (the limit cut it
   * short): the rest is done by the helpers, a little slower.
   */
  for (; done < d->batch_len; done++)
    perform_on_helper (d, (struct request *) d->batch[done]->data);
  d->batch_len = 0;
}

void
dispatch_submit (struct dispatch *d)
{
  if (d->batch_len)
    submit_batch (d);
}

bool
dispatch_ring_full (struct dispatch *d)
{
  /* in_kernel counts the batch too. */
  return d->in_kernel >= d->depth && !grow_ring (d);
}

/* Hands the engine the result RES of IO, a request of dispatch OPAQUE
 * that was in flight (in an AIO context, or taken by the store and
 * posted to the port); a short transfer goes round again.
 */
static void
complete_in_flight (void *opaque, struct mloop_io *io, long res)
{
  struct dispatch *d = opaque;
  struct request *req = (struct request *) io;

  req->conn->in_kernel--;
  d->in_kernel--;
  if (mloop_engine_complete_event (d->engine, &req->io, res)
      == MLOOP_EVENT_RESUBMIT)
    add_to_batch (d, req);
}

/* Reaps what RING completed; *IN_FLIGHT counts what it holds. */
static void
reap_ring (struct dispatch *d, struct mloop_aio_ring *ring,
           unsigned *in_flight)
{
  struct io_event events[REAP_BATCH];
  int n, i;

  do {
    n = mloop_aio_ring_reap (ring, 0, events, REAP_BATCH, NULL);
    for (i = 0; i < n; i++) {
      (*in_flight)--;
      complete_in_flight (d, events[i].data, (long) events[i].res);
    }
  } while (n == REAP_BATCH);
}

void
dispatch_reap (struct dispatch *d)
{
  uint64_t count;

  /* Reset the eventfd before reaping, so a completion racing with us
   * signals it again rather than being missed.  Both contexts signal it.
   */
  if (read (d->aio_efd, &count, sizeof count) == -1 && errno != EAGAIN)
    return;
  if (d->old.ctx) {
    reap_ring (d, &d->old, &d->old_in_flight);
    if (d->old_in_flight == 0)
      mloop_aio_ring_destroy (&d->old);
  }
  if (d->ring.ctx)
    reap_ring (d, &d->ring, &d->ring_in_flight);
  mloop_port_queue_drain (&d->port, complete_in_flight, d);  /* the store's */
  dispatch_submit (d);          /* short-transfer resubmissions */
}

/* ------------------------------------------------------------ helpers */

static struct request *
request_of_job (struct offload_job *job)
{
  return (struct request *) ((char *) job - offsetof (struct request, job));
}

/* BLOCK_STATUS descriptors being written into a request's buffer. */
struct extents {
  unsigned char *out;           /* CONN_EXTENTS_MAX descriptors */
  unsigned n;
  uint32_t last_len, last_flags;        /* out's last one, host order */
  bool full;
};

/* Writes X's last extent as descriptor I (big-endian length, flags). */
static void
put_descriptor (struct extents *x, unsigned i)
{
  uint32_t be[2] = { htobe32 (x->last_len), htobe32 (x->last_flags) };

  memcpy (x->out + 8 * i, be, 8);
}

/* The engine's extent callback: one descriptor per extent (length,
 * base:allocation flags), merged with the one before when the state is
 * the same; stops the walk when the buffer is full, which the spec
 * allows (the client asks again from where the reply ended).
 */
static int
add_descriptor (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  struct extents *x = opaque;
  const uint32_t flags = hole ? NBD_STATE_HOLE | NBD_STATE_ZERO : 0;

  (void) offset;                /* consecutive: the walk's own order */
  if (x->n > 0 && x->last_flags == flags &&
      length <= UINT32_MAX - x->last_len) {
    x->last_len += (uint32_t) length;
    put_descriptor (x, x->n - 1);
    return 0;
  }
  if (x->n == CONN_EXTENTS_MAX) {
    x->full = true;
    return -ENOBUFS;
  }
  /* The walk never goes past the request, whose length is 32 bits. */
  x->last_len = (uint32_t) length;
  x->last_flags = flags;
  put_descriptor (x, x->n++);
  return 0;
}

/* On a helper thread: the extents of a BLOCK_STATUS, through the
 * engine's SEEK_DATA/SEEK_HOLE walk (the one nbdkit's plugin uses), into
 * req->buf; sets req->data_len.
 */
static int
block_status (struct mloop_engine *e, struct request *req)
{
  struct extents x = { .out = req->buf };
  struct mloop_io *io = &req->io;
  int r = mloop_engine_extents (e, io->offset, io->count,
                                io->flags & NBD_CMD_FLAG_REQ_ONE,
                                add_descriptor, &x);

  if (x.full)
    r = 0;                      /* a shorter answer, not an error */
  if (r == 0 && x.n == 0)
    r = -EIO;                   /* the spec wants at least one */
  req->data_len = r == 0 ? 8 * (size_t) x.n : 0;
  return r;
}

/* On a helper thread: the request's blocking work.  Reads only what the
 * worker set before handing it over, and the engine.
 */
static void
run_blocking (struct offload_job *job)
{
  struct request *req = request_of_job (job);
  struct mloop_engine *e = req->conn->set->dispatch->engine;
  struct mloop_io *io = &req->io;

  switch (req->type) {
  case NBD_CMD_TRIM:
    req->result = mloop_engine_trim (e, io->offset, io->count, io->flags);
    break;
  case NBD_CMD_WRITE_ZEROES:
    req->result = mloop_engine_zero (e, io->offset, io->count, io->flags);
    break;
  case NBD_CMD_BLOCK_STATUS:
    req->result = block_status (e, req);
    break;
  default:                      /* READ, WRITE or FLUSH the engine
                                   said must block */
    req->result = mloop_engine_perform_blocking (e, io);
    break;
  }
}

/* On a helper thread: what the kernel would have done with the iocb of
 * a request no AIO context had room for.
 */
static void
run_event (struct offload_job *job)
{
  struct request *req = request_of_job (job);

  req->result = (int) mloop_engine_perform_event (req->conn->set->dispatch
                                                  ->engine, &req->io);
}

static void
offload_request (struct dispatch *d, struct request *req,
                 void (*run) (struct offload_job *))
{
  req->job.run = run;
  req->job.home = &d->done;
  req->job.tenant = d->tenant;
  req->conn->in_helpers++;
  d->in_helpers++;
  offload_submit (d->offload, &req->job);
}

static void
perform_on_helper (struct dispatch *d, struct request *req)
{
  req->conn->in_kernel--;
  d->in_kernel--;
  offload_request (d, req, run_event);
}

void
dispatch_take_done (struct dispatch *d)
{
  struct offload_job *job = offload_inbox_take (&d->done);

  while (job) {
    struct request *req = request_of_job (job);
    struct mloop_io *io = &req->io;
    int r = req->result;

    job = job->next;
    req->conn->in_helpers--;
    d->in_helpers--;
    if (req->job.run == run_event) {
      /* As if reaped: a short transfer goes round again. */
      if (mloop_engine_complete_event (d->engine, io, r)
          == MLOOP_EVENT_RESUBMIT)
        add_to_batch (d, req);
      continue;
    }
    switch (req->type) {
    case NBD_CMD_TRIM:
    case NBD_CMD_WRITE_ZEROES:
    case NBD_CMD_BLOCK_STATUS:
      if (r < 0 && r != -EINVAL && r != -EPERM && r != -ENOSPC)
        log_io_error (req, io->offset, io->count, -r);
      conn_queue_reply (req, nbd_errno (-r));
      break;
    default:
      mloop_engine_complete_blocking (d->engine, io, r);
      break;
    }
  }
}

bool
dispatch_idle (const struct dispatch *d)
{
  return d->in_kernel == 0 && d->in_helpers == 0;
}

/* ------------------------------------------------------------ requests */

/* Sends READ/WRITE/FLUSH to the engine. */
static void
start_io (struct dispatch *d, struct request *req, enum mloop_io_op op,
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
  io->port = &d->port.port;
  r = mloop_engine_prepare (d->engine, io);
  if (r == MLOOP_PREPARED_AIO)
    add_to_batch (d, req);
  else if (r == MLOOP_PREPARED_QUEUED) {
    /* In flight as AIO is: the depth limit and idleness count it. */
    req->conn->in_kernel++;
    d->in_kernel++;
  }
  else if (r == MLOOP_PREPARED_BLOCKING)
    offload_request (d, req, run_blocking);
  else if (r < 0)
    conn_queue_reply (req, nbd_errno (-r));
  /* MLOOP_PREPARED_DONE: completed already, reply queued. */
}

void
dispatch_request (struct dispatch *d, struct request *req, uint64_t offset,
                  uint32_t length)
{
  const uint16_t f = req->flags;
  unsigned io_flags = (f & NBD_CMD_FLAG_FUA) ? MLOOP_IO_FUA : 0;

  switch (req->type) {
  case NBD_CMD_READ:
    start_io (d, req, MLOOP_IO_READ, 0, offset, length);
    return;
  case NBD_CMD_WRITE:
    start_io (d, req, MLOOP_IO_WRITE, io_flags, offset, length);
    return;
  case NBD_CMD_FLUSH:
    if (d->ack_flush_early) {
      conn_queue_reply (req, 0);        /* the lie the power-cut test
                                           must catch */
      return;
    }
    /* Every write replied to before this flush arrived has completed
     * (replies are sent from completions), so the fdatasync covers
     * exactly what NBD requires, without waiting for anything else.
     */
    start_io (d, req, MLOOP_IO_FLUSH, 0, 0, 0);
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
    offload_request (d, req, run_blocking);
    return;
  case NBD_CMD_BLOCK_STATUS:
    /* lseek(SEEK_DATA) may read metadata from disk: a helper's work. */
    req->io.offset = offset;
    req->io.count = length;
    req->io.flags = f & NBD_CMD_FLAG_REQ_ONE;
    offload_request (d, req, run_blocking);
    return;
  default:
    conn_queue_reply (req, NBD_EINVAL);   /* request_check() refuses it */
    return;
  }
}

/* ------------------------------------------------------------ setup */

bool
mloop_test_ack_flush_early (void)
{
  const char *v = getenv ("MLOOP_TEST_ACK_FLUSH_EARLY");

  return v != NULL && strcmp (v, "1") == 0;
}

int
dispatch_init (struct dispatch *d, struct mloop_engine *engine,
               struct offload *offload, struct offload_tenant *tenant,
               unsigned ring_depth)
{
  int saved;

  *d = (struct dispatch) {
    .engine = engine, .offload = offload, .tenant = tenant,
    .ring_depth = ring_depth,
    .depth = ring_depth < DISPATCH_RING_FIRST ? ring_depth
      : DISPATCH_RING_FIRST,
    .aio_efd = -1, .done.efd = -1,
  };
  /* A test-only switch: answer FLUSH at once, without the fdatasync, so
   * the kernel power-cut test (tests/kernel/test-power-cut-early-ack.py) shows
   * it catches a server that acknowledges what is not stable.  Never set
   * it for real use: an acknowledged flush then promises nothing.
   */
  d->ack_flush_early = mloop_test_ack_flush_early ();
  /* Room for a full round of resubmissions beyond the depth limit.
   * Only the first batch_len entries are read, so not zeroed: an idle
   * worker's pages stay untouched.
   */
  d->batch = malloc ((ring_depth + CONN_SLOTS) * sizeof *d->batch);
  if (d->batch == NULL)
    return -1;
  d->aio_efd = eventfd (0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->aio_efd == -1 || offload_inbox_init (&d->done) == -1)
    goto fail;
  mloop_port_queue_init (&d->port, d->aio_efd);
  /* The AIO context waits for the first request (open_ring): a worker
   * no connection reaches, of a device nobody uses, reserves nothing.
   */
  return 0;

 fail:
  saved = errno;
  if (d->aio_efd >= 0)
    close (d->aio_efd);
  offload_inbox_destroy (&d->done);
  free (d->batch);
  errno = saved;
  return -1;
}

void
dispatch_close_rings (struct dispatch *d)
{
  mloop_aio_ring_destroy (&d->old);
  mloop_aio_ring_destroy (&d->ring);
}

void
dispatch_destroy (struct dispatch *d)
{
  dispatch_close_rings (d);
  close (d->aio_efd);
  offload_inbox_destroy (&d->done);
  free (d->batch);
}
