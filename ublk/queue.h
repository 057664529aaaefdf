/* One ublk hardware queue: a thread with its own io_uring that fetches
 * the queue's requests from /dev/ublkcN and serves them through the IO
 * engine (engine/), like the plugin and mloop-server do. */
#ifndef MLOOP_UBLK_QUEUE_H
#define MLOOP_UBLK_QUEUE_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>

#include "aio_ring.h"
#include "engine.h"
#include "uapi.h"

struct ublk_queue;

/* One tag's request to the engine; it lives as long as the queue. */
struct ublk_tag {
  struct mloop_io io;
  struct ublk_queue *q;
  unsigned tag;
};

struct ublk_queue {
  unsigned q_id, depth, max_io_bytes;
  int cdev_fd;                  /* /dev/ublkcN, shared by the queues */
  struct mloop_engine *engine;  /* shared by the queues */
  const struct ublksrv_io_desc *descs;  /* the kernel's, read-only, by tag */
  size_t descs_len;
  void **bufs;                  /* one per tag, page-aligned */
  struct ublk_tag *tags;
  /* The engine's AIO goes to this queue's own kernel AIO context; each
   * iocb signals efd, which a read in the io_uring waits on, so one
   * io_uring_wait wakes for ublk commands and image IO alike. */
  struct mloop_aio_ring aio;
  bool aio_open;
  struct iocb **pending;        /* prepared, for the next io_submit */
  unsigned npending;
  int efd;
  uint64_t efd_count;
  struct io_uring ring;
  pthread_t thread;
  atomic_bool stop;             /* set once the device is stopped */
  int err;                      /* the first failure, a negative errno */
};

/* Maps the descriptors, allocates the buffers, opens the AIO context;
 * 0 or a negative errno. */
int ublk_queue_init (struct ublk_queue *q, int cdev_fd,
                     struct mloop_engine *engine, unsigned q_id,
                     unsigned depth, unsigned max_io_bytes);
/* The thread: fetches every tag, then serves until the kernel aborts
 * the fetches or q->stop is set. */
int ublk_queue_start (struct ublk_queue *q);
void ublk_queue_join (struct ublk_queue *q);
void ublk_queue_free (struct ublk_queue *q);

#endif
