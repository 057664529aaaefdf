/* One ublk hardware queue: a thread with its own io_uring that fetches
 * the queue's requests from /dev/ublkcN and serves them on the image. */
#ifndef MLOOP_UBLK_QUEUE_H
#define MLOOP_UBLK_QUEUE_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>

#include "uapi.h"

struct ublk_queue {
  unsigned q_id, depth, max_io_bytes;
  int cdev_fd;                  /* /dev/ublkcN, shared by the queues */
  int image_fd;
  const struct ublksrv_io_desc *descs;  /* the kernel's, read-only, by tag */
  size_t descs_len;
  void **bufs;                  /* one per tag */
  struct io_uring ring;
  pthread_t thread;
  atomic_bool stop;             /* set once the device is stopped */
  int err;                      /* the first failure, a negative errno */
};

/* Maps the descriptors and allocates the buffers; 0 or a negative errno. */
int ublk_queue_init (struct ublk_queue *q, int cdev_fd, int image_fd,
                     unsigned q_id, unsigned depth, unsigned max_io_bytes);
/* The thread: fetches every tag, then serves until the kernel aborts
 * the fetches or q->stop is set. */
int ublk_queue_start (struct ublk_queue *q);
void ublk_queue_join (struct ublk_queue *q);
void ublk_queue_free (struct ublk_queue *q);

#endif
