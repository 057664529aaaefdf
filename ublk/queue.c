/* A ublk queue's thread.  Each tag cycles through
 *   FETCH_REQ (or COMMIT_AND_FETCH_REQ) -> the kernel hands us a request
 *   -> the engine serves it -> COMMIT_AND_FETCH_REQ with its result.
 * Reads, writes and flushes the engine can do asynchronously go to this
 * queue's kernel AIO context; their completions signal an eventfd whose
 * read sits in the same io_uring as the ublk commands, so the thread
 * sleeps in one place and keeps the queue's full depth in flight.
 * What the engine can only do synchronously (a read-modify-write of a
 * partial block, the page-cache tail, trim and zero) goes to the helper
 * threads (offload.h), which post it back through the same eventfd.  The
 * kernel binds a queue to the task that fetched its tags, so everything
 * on the ring, the engine's completions included, happens in this
 * thread. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include "queue.h"
#include "space.h"

/* user_data of the eventfd read; ublk commands carry their tag. */
#define AIO_EVENTS (1ULL << 63)

int
ublk_queue_init (struct ublk_queue *q, int cdev_fd,
                 struct mloop_engine *engine, struct mloop_aio_ring *aio,
                 struct ublk_offload *offload, unsigned q_id, unsigned depth,
                 unsigned max_io_bytes)
{
  memset (q, 0, sizeof *q);
  q->aio = *aio;
  q->aio_open = true;
  q->offload = offload;
  q->efd = -1;
  q->q_id = q_id;
  q->depth = depth;
  q->max_io_bytes = max_io_bytes;
  q->cdev_fd = cdev_fd;
  q->engine = engine;
  long page = sysconf (_SC_PAGESIZE);
  /* Queue N's descriptors start at N times the largest possible array
   * (UBLK_MAX_QUEUE_DEPTH of them), page-rounded; this queue's own
   * array must be mapped with exactly its page-rounded size. */
  size_t stride = (UBLK_MAX_QUEUE_DEPTH * sizeof (struct ublksrv_io_desc) + page - 1)
                  & ~(page - 1);
  q->descs_len = (depth * sizeof (struct ublksrv_io_desc) + page - 1) & ~(page - 1);
  void *m = mmap (NULL, q->descs_len, PROT_READ, MAP_SHARED | MAP_POPULATE,
                  cdev_fd, UBLKSRV_CMD_BUF_OFFSET + (off_t) q_id * stride);
  if (m == MAP_FAILED)
    return -errno;
  q->descs = m;
  q->bufs = calloc (depth, sizeof *q->bufs);
  q->tags = calloc (depth, sizeof *q->tags);
  q->pending = calloc (depth, sizeof *q->pending);
  if (!q->bufs || !q->tags || !q->pending)
    return -ENOMEM;
  /* Page-aligned, so O_DIRECT needs no bounce buffer. */
  for (unsigned t = 0; t < depth; t++) {
    int r = posix_memalign (&q->bufs[t], page, max_io_bytes);
    if (r)
      return -r;
    q->tags[t].q = q;
    q->tags[t].tag = t;
  }
  q->efd = eventfd (0, EFD_CLOEXEC);
  if (q->efd < 0)
    return -errno;
  mloop_port_queue_init (&q->port, q->efd);
  int r = pthread_mutex_init (&q->inbox.lock, NULL);
  if (r)
    return -r;
  q->inbox.efd = q->efd;
  q->inbox_open = true;
  return 0;
}

void
ublk_queue_free (struct ublk_queue *q)
{
  /* io_destroy waits for AIO still in flight, which may point into the
   * buffers: first. */
  if (q->aio_open)
    mloop_aio_ring_destroy (&q->aio);
  q->aio_open = false;
  if (q->inbox_open)
    pthread_mutex_destroy (&q->inbox.lock);
  q->inbox_open = false;
  if (q->efd >= 0)
    close (q->efd);
  q->efd = -1;
  if (q->bufs)
    for (unsigned t = 0; t < q->depth; t++)
      free (q->bufs[t]);
  free (q->bufs);
  q->bufs = NULL;
  free (q->tags);
  q->tags = NULL;
  free (q->pending);
  q->pending = NULL;
  if (q->descs)
    munmap ((void *) q->descs, q->descs_len);
  q->descs = NULL;
}

/* A free SQE.  The ring has room for one command per tag plus the
 * eventfd read, twice over, and no more are ever queued, so a full ring
 * only means the kernel has not taken what we queued yet: submitting
 * frees the slots.  NULL (with q->err set) only when the kernel refuses
 * the submission; the queue then ends. */
static struct io_uring_sqe *
get_sqe (struct ublk_queue *q)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&q->ring);
  if (!sqe) {
    int r = io_uring_submit (&q->ring);
    sqe = io_uring_get_sqe (&q->ring);
    if (!sqe && !q->err)
      q->err = r < 0 ? r : -EBUSY;
  }
  return sqe;
}

static enum mloop_stats_command
stats_command (unsigned op)
{
  switch (op) {
  case UBLK_IO_OP_READ: return MLOOP_STATS_READ;
  case UBLK_IO_OP_WRITE: return MLOOP_STATS_WRITE;
  case UBLK_IO_OP_FLUSH: return MLOOP_STATS_FLUSH;
  case UBLK_IO_OP_DISCARD: return MLOOP_STATS_TRIM;
  case UBLK_IO_OP_WRITE_ZEROES: return MLOOP_STATS_ZERO;
  default: return MLOOP_STATS_OTHER;
  }
}

static const char *
op_name (unsigned op)
{
  switch (op) {
  case UBLK_IO_OP_READ: return "read";
  case UBLK_IO_OP_WRITE: return "write";
  case UBLK_IO_OP_FLUSH: return "flush";
  case UBLK_IO_OP_DISCARD: return "discard";
  case UBLK_IO_OP_WRITE_ZEROES: return "zero";
  default: return "command";
  }
}

/* Counts TAG's request, finished with RESULT (bytes, or -errno), and
 * logs a failure in a line naming the request, as mloop-server does:
 * the kernel only says "I/O error" (or passes ENOSPC on). */
static void
account_request (struct ublk_queue *q, unsigned tag, int result)
{
  unsigned op = q->tags[tag].op;

  if (result < 0) {
    const struct ublksrv_io_desc *iod = &q->descs[tag];
    fprintf (stderr, "mloop-ublk: error: %s: %" PRIu64 " bytes at offset %"
             PRIu64 ": %s\n", op_name (op), (uint64_t) iod->nr_sectors << 9,
             (uint64_t) iod->start_sector << 9, strerror (-result));
  }
  if (q->stats == NULL)
    return;
  MLOOP_STATS_ADD (q->stats, requests[stats_command (op)], 1);
  MLOOP_STATS_SUB (q->stats, in_flight, 1);
  if (result < 0)
    MLOOP_STATS_ADD (q->stats, errors, 1);
  else if (op == UBLK_IO_OP_READ)
    MLOOP_STATS_ADD (q->stats, bytes_read, (uint64_t) result);
  else if (op == UBLK_IO_OP_WRITE)
    MLOOP_STATS_ADD (q->stats, bytes_written, (uint64_t) result);
}

/* FETCH_REQ for a fresh tag, else COMMIT_AND_FETCH_REQ with RESULT. */
static void
queue_fetch (struct ublk_queue *q, unsigned tag, bool commit, int result)
{
  struct ublksrv_io_cmd cmd = {
    .q_id = q->q_id,
    .tag = tag,
    .result = result,
    .addr = (__u64) (uintptr_t) q->bufs[tag],
  };
  struct io_uring_sqe *sqe = get_sqe (q);
  if (commit)
    account_request (q, tag, result);
  if (sqe)
    ublk_prep_cmd (sqe, q->cdev_fd,
                   commit ? UBLK_U_IO_COMMIT_AND_FETCH_REQ : UBLK_U_IO_FETCH_REQ,
                   &cmd, sizeof cmd, tag);
}

/* Waits (in the ring) for the next signal of an AIO completion or a
 * finished helper job. */
static void
arm_aio_events (struct ublk_queue *q)
{
  struct io_uring_sqe *sqe = get_sqe (q);
  if (!sqe)
    return;
  io_uring_prep_read (sqe, q->efd, &q->efd_count, sizeof q->efd_count, 0);
  io_uring_sqe_set_data64 (sqe, AIO_EVENTS);
}

/* The engine's completion of a tag's request (any path): commit it.
 * ublk wants the bytes done for reads and writes, 0 for a flush. */
static void
tag_complete (struct mloop_io *io, int error)
{
  struct ublk_tag *t = io->opaque;
  int result = error ? -error : io->op == MLOOP_IO_FLUSH ? 0 : (int) io->count;
  queue_fetch (t->q, t->tag, true, result);
}

/* Queues IO, prepared for AIO, for flush_aio; its completion will
 * signal efd.  At most one per tag, so PENDING never overflows. */
static void
submit_aio (struct ublk_queue *q, struct mloop_io *io)
{
  io_set_eventfd (&io->iocb, q->efd);
  q->pending[q->npending++] = &io->iocb;
}

/* One io_submit for every request the last batch of CQEs started: the
 * syscall per request cost as much as the IO.  What the kernel refuses
 * is committed with its error. */
static void
flush_aio (struct ublk_queue *q)
{
  for (unsigned done = 0; done < q->npending;) {
    int r = mloop_aio_ring_submit (&q->aio, q->pending + done,
                                   q->npending - done);
    if (r >= 0) {
      done += r;
      continue;
    }
    struct mloop_io *io = q->pending[done++]->data;
    struct ublk_tag *t = io->opaque;
    mloop_engine_abandon (q->engine, io);
    queue_fetch (q, t->tag, true, r);
  }
  q->npending = 0;
}

/* On a helper thread: what the queue thread must not wait for. */
static int
run_job (struct ublk_job *job)
{
  struct ublk_tag *t = (struct ublk_tag *) ((char *) job - offsetof (struct ublk_tag, job));
  struct mloop_engine *e = t->q->engine;
  switch (t->op) {
  case UBLK_IO_OP_DISCARD:
    return mloop_engine_trim (e, t->off, t->len, 0);
  case UBLK_IO_OP_WRITE_ZEROES:
    return mloop_engine_zero (e, t->off, t->len,
                              t->flags & UBLK_IO_F_NOUNMAP ? MLOOP_ZERO_NO_HOLE : 0);
  default:                      /* prepared as MLOOP_PREPARED_BLOCKING */
    return mloop_engine_perform_blocking (e, &t->io);
  }
}

static void
offload_tag (struct ublk_queue *q, struct ublk_tag *t)
{
  t->job = (struct ublk_job) { .run = run_job, .home = &q->inbox };
  ublk_offload_submit (q->offload, &t->job);
}

/* Back on the queue thread: completes what the helpers finished. */
static void
take_jobs (struct ublk_queue *q)
{
  for (struct ublk_job *job = ublk_inbox_take (&q->inbox), *next; job; job = next) {
    next = job->next;
    struct ublk_tag *t = (struct ublk_tag *) ((char *) job - offsetof (struct ublk_tag, job));
    if (t->op == UBLK_IO_OP_DISCARD || t->op == UBLK_IO_OP_WRITE_ZEROES)
      queue_fetch (q, t->tag, true, job->result);
    else                        /* tag_complete commits it */
      mloop_engine_complete_blocking (q->engine, &t->io, job->result);
  }
}

/* Starts the request the kernel just handed TAG.  0 when it is queued
 * for AIO, in flight or already committed; -errno when refused, for the caller to
 * commit. */
static int
queue_request (struct ublk_queue *q, unsigned tag)
{
  const struct ublksrv_io_desc *iod = &q->descs[tag];
  unsigned op = ublksrv_get_op (iod);
  unsigned flags = ublksrv_get_flags (iod);
  uint64_t off = (uint64_t) iod->start_sector << 9;
  uint64_t len = (uint64_t) iod->nr_sectors << 9;
  struct ublk_tag *t = &q->tags[tag];
  struct mloop_io *io = &t->io;
  int r;

  t->op = op;
  MLOOP_STATS_ADD (q->stats, in_flight, 1);
  switch (op) {
  case UBLK_IO_OP_READ:
  case UBLK_IO_OP_WRITE:
  case UBLK_IO_OP_FLUSH:
    break;
  case UBLK_IO_OP_DISCARD:
  case UBLK_IO_OP_WRITE_ZEROES:
    /* No AIO form, and a large one can take seconds: a helper's. */
    t->off = off;
    t->len = len;
    t->flags = flags;
    offload_tag (q, t);
    return 0;
  default:
    return -EOPNOTSUPP;
  }
  if (op != UBLK_IO_OP_FLUSH && len > q->max_io_bytes)
    return -EINVAL;

  *io = (struct mloop_io) {
    .op = op == UBLK_IO_OP_READ ? MLOOP_IO_READ
          : op == UBLK_IO_OP_WRITE ? MLOOP_IO_WRITE : MLOOP_IO_FLUSH,
    .flags = op == UBLK_IO_OP_WRITE && (flags & UBLK_IO_F_FUA) ? MLOOP_IO_FUA : 0,
    .buf = q->bufs[tag],
    .count = op == UBLK_IO_OP_FLUSH ? 0 : len,
    .offset = op == UBLK_IO_OP_FLUSH ? 0 : off,
    .complete = tag_complete,
    .opaque = &q->tags[tag],
    .port = &q->port.port,
  };
  r = mloop_engine_prepare (q->engine, io);
  switch (r) {
  case MLOOP_PREPARED_DONE:     /* tag_complete has committed it */
    return 0;
  case MLOOP_PREPARED_AIO:
    submit_aio (q, io);
    return 0;
  case MLOOP_PREPARED_QUEUED:   /* the store posts it to q->port */
    return 0;
  case MLOOP_PREPARED_BLOCKING:
    offload_tag (q, t);
    return 0;
  default:
    return r;                   /* refused up front: complete not called */
  }
}

/* Hands the engine the result RES of IO, which queue OPAQUE had in
 * flight (in its AIO context, or taken by the store and posted to the
 * port). */
static void
complete_in_flight (void *opaque, struct mloop_io *io, long res)
{
  struct ublk_queue *q = opaque;
  if (mloop_engine_complete_event (q->engine, io, res)
      == MLOOP_EVENT_RESUBMIT)
    submit_aio (q, io);         /* a short transfer: the rest */
}

/* Completes whatever AIO has finished, and waits for the next signal. */
static void
reap_aio (struct ublk_queue *q)
{
  struct io_event events[64];
  struct timespec now = { 0 };
  int n;
  do {
    n = mloop_aio_ring_reap (&q->aio, 0, events, 64, &now);
    for (int i = 0; i < n; i++)
      complete_in_flight (q, events[i].data, (long) events[i].res);
  } while (n == 64);
  if (n < 0 && !q->err)
    q->err = n;
  mloop_port_queue_drain (&q->port, complete_in_flight, q);
  take_jobs (q);
  arm_aio_events (q);
}

static void *
queue_main (void *arg)
{
  struct ublk_queue *q = arg;
  unsigned live = q->depth;     /* tags with a fetch in the kernel */

  arm_aio_events (q);
  for (unsigned t = 0; t < q->depth; t++)
    queue_fetch (q, t, false, 0);
  /* q->stop is checked on every pass, not only when idle: a busy device
   * being left without STOP_DEV (a failed --recover) must not keep its
   * joiner waiting. */
  while (live > 0 && !q->err && !atomic_load (&q->stop)) {
    flush_aio (q);
    int r = io_uring_submit (&q->ring);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      q->err = r;
      break;
    }
    struct io_uring_cqe *cqe;
    /* The timeout only lets the thread notice q->stop: a stopped device
     * may leave the fetches pending until the ring is closed. */
    struct __kernel_timespec ts = { .tv_nsec = 200 * 1000 * 1000 };
    r = io_uring_wait_cqe_timeout (&q->ring, &cqe, &ts);
    if (r == -ETIME || r == -EINTR) {
      if (atomic_load (&q->stop))
        break;
      continue;
    }
    if (r < 0) {
      q->err = r;
      break;
    }
    unsigned head, seen = 0;
    bool aio_signalled = false;
    io_uring_for_each_cqe (&q->ring, head, cqe) {
      seen++;
      int res = cqe->res;
      if (cqe->user_data == AIO_EVENTS) {
        if (res < 0 && res != -EINTR && res != -EAGAIN && !q->err)
          q->err = res;
        aio_signalled = true;
        continue;
      }
      unsigned tag = cqe->user_data;
      if (res == UBLK_IO_RES_OK) {
        int now = queue_request (q, tag);
        if (now < 0)
          queue_fetch (q, tag, true, now);
        continue;
      }
      /* UBLK_IO_RES_ABORT: the device is going away; anything else is a
       * refused command, which ends this tag too. */
      if (res != UBLK_IO_RES_ABORT && !q->err)
        q->err = res;
      live--;
    }
    io_uring_cq_advance (&q->ring, seen);
    /* After the CQ is advanced: reaping queues SQEs, never CQEs. */
    if (aio_signalled)
      reap_aio (q);
  }
  /* Not asked to stop: the device was stopped from outside (every fetch
   * aborted) or this queue failed.  Either way the device is of no use
   * any more; the main thread, in sigwait, takes it down. */
  atomic_store (&q->ended, true);
  if (!atomic_load (&q->stop))
    kill (getpid (), SIGTERM);
  return NULL;
}

int
ublk_queue_start (struct ublk_queue *q)
{
  /* At most one SQE per tag is ever queued, plus the eventfd read;
   * twice that for slack. */
  int r = io_uring_queue_init (2 * (q->depth + 1), &q->ring, IORING_SETUP_SQE128);
  if (r < 0)
    return r;
  r = pthread_create (&q->thread, NULL, queue_main, q);
  if (r) {
    io_uring_queue_exit (&q->ring);
    return -r;
  }
  return 0;
}

void
ublk_queue_join (struct ublk_queue *q)
{
  atomic_store (&q->stop, true);
  pthread_join (q->thread, NULL);
  /* Closing the ring cancels any fetch the kernel still holds. */
  io_uring_queue_exit (&q->ring);
}
