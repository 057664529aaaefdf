/* A ublk queue's thread.  Each tag cycles through
 *   FETCH_REQ (or COMMIT_AND_FETCH_REQ) -> the kernel hands us a request
 *   -> read/write/fsync on the image in the same ring -> COMMIT_AND_FETCH
 * so the thread never blocks on the image and the queue keeps its full
 * depth in flight.  The kernel binds a queue to the task that fetched its
 * tags, so everything on the ring happens in this thread. */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "queue.h"

/* user_data: the tag, with this bit for the image IO's completions. */
#define IMAGE_IO (1ULL << 63)

int
ublk_queue_init (struct ublk_queue *q, int cdev_fd, int image_fd,
                 unsigned q_id, unsigned depth, unsigned max_io_bytes)
{
  memset (q, 0, sizeof *q);
  q->q_id = q_id;
  q->depth = depth;
  q->max_io_bytes = max_io_bytes;
  q->cdev_fd = cdev_fd;
  q->image_fd = image_fd;
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
  if (!q->bufs)
    return -ENOMEM;
  for (unsigned t = 0; t < depth; t++) {
    int r = posix_memalign (&q->bufs[t], page, max_io_bytes);
    if (r)
      return -r;
  }
  return 0;
}

void
ublk_queue_free (struct ublk_queue *q)
{
  if (q->bufs)
    for (unsigned t = 0; t < q->depth; t++)
      free (q->bufs[t]);
  free (q->bufs);
  q->bufs = NULL;
  if (q->descs)
    munmap ((void *) q->descs, q->descs_len);
  q->descs = NULL;
}

static struct io_uring_sqe *
get_sqe (struct ublk_queue *q)
{
  struct io_uring_sqe *sqe = io_uring_get_sqe (&q->ring);
  if (!sqe) {                   /* full: hand what is queued to the kernel */
    io_uring_submit (&q->ring);
    sqe = io_uring_get_sqe (&q->ring);
  }
  return sqe;
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
  ublk_prep_cmd (get_sqe (q), q->cdev_fd,
                 commit ? UBLK_U_IO_COMMIT_AND_FETCH_REQ : UBLK_U_IO_FETCH_REQ,
                 &cmd, sizeof cmd, tag);
}

/* The image IO for the request the kernel just handed TAG; -errno when
 * there is none to do and the answer is known now. */
static int
queue_request (struct ublk_queue *q, unsigned tag)
{
  const struct ublksrv_io_desc *iod = &q->descs[tag];
  unsigned op = ublksrv_get_op (iod);
  unsigned flags = ublksrv_get_flags (iod);
  off_t off = (off_t) iod->start_sector << 9;
  unsigned len = iod->nr_sectors << 9;
  void *buf = (void *) (uintptr_t) iod->addr;
  struct io_uring_sqe *sqe;

  if ((op == UBLK_IO_OP_READ || op == UBLK_IO_OP_WRITE) && len > q->max_io_bytes)
    return -EINVAL;
  switch (op) {
  case UBLK_IO_OP_READ:
    sqe = get_sqe (q);
    io_uring_prep_read (sqe, q->image_fd, buf, len, off);
    break;
  case UBLK_IO_OP_WRITE:
    sqe = get_sqe (q);
    io_uring_prep_write (sqe, q->image_fd, buf, len, off);
    if (flags & UBLK_IO_F_FUA)
      sqe->rw_flags = RWF_DSYNC;
    break;
  case UBLK_IO_OP_FLUSH:
    sqe = get_sqe (q);
    io_uring_prep_fsync (sqe, q->image_fd, IORING_FSYNC_DATASYNC);
    break;
  default:                      /* DISCARD, WRITE_ZEROES: not offered yet */
    return -EOPNOTSUPP;
  }
  io_uring_sqe_set_data64 (sqe, tag | IMAGE_IO);
  return 0;
}

static void *
queue_main (void *arg)
{
  struct ublk_queue *q = arg;
  unsigned live = q->depth;     /* tags with a fetch in the kernel */

  for (unsigned t = 0; t < q->depth; t++)
    queue_fetch (q, t, false, 0);
  while (live > 0) {
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
    io_uring_for_each_cqe (&q->ring, head, cqe) {
      seen++;
      unsigned tag = cqe->user_data & ~IMAGE_IO;
      int res = cqe->res;
      if (cqe->user_data & IMAGE_IO) {
        queue_fetch (q, tag, true, res);   /* bytes, 0 or -errno: as is */
        continue;
      }
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
  }
  return NULL;
}

int
ublk_queue_start (struct ublk_queue *q)
{
  /* At most one SQE per tag is ever queued; twice that for slack. */
  int r = io_uring_queue_init (2 * q->depth, &q->ring, IORING_SETUP_SQE128);
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
