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
#include "stats.h"
#include "offload.h"
#include "uapi.h"

struct ublk_queue;

/* One tag's request to the engine; it lives as long as the queue. */
struct ublk_tag {
  struct mloop_io io;
  struct ublk_queue *q;
  unsigned tag;
  /* When the request went to a helper (offload.h): what it does there. */
  struct ublk_job job;
  unsigned op;                  /* UBLK_IO_OP_* */
  uint64_t off, len;
  unsigned flags;               /* UBLK_IO_F_* */
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
  struct ublk_offload *offload; /* helpers, shared by the queues */
  /* Request counters for `mloop status` (nbd/stats.h), shared by the
   * queues, or NULL. */
  struct mloop_stats *stats;
  struct ublk_inbox inbox;      /* their finished jobs; inbox.efd == efd */
  bool inbox_open;
  /* Completions of a store with threads of its own (RBD): posted here,
   * announced on efd like AIO's (engine/port.h). */
  struct mloop_port_queue port;
  struct iocb **pending;        /* prepared, for the next io_submit */
  unsigned npending;
  int efd;
  uint64_t efd_count;
  struct io_uring ring;
  pthread_t thread;
  atomic_bool stop;             /* set once the device is stopped */
  atomic_bool ended;            /* the thread is done serving */
  int err;                      /* the first failure, a negative errno */
};

/* Maps the descriptors and allocates the buffers; takes AIO, an open
 * AIO context of at least DEPTH events (ublk_queue_free destroys it,
 * also on failure).  0 or a negative errno. */
int ublk_queue_init (struct ublk_queue *q, int cdev_fd,
                     struct mloop_engine *engine, struct mloop_aio_ring *aio,
                     struct ublk_offload *offload, unsigned q_id,
                     unsigned depth, unsigned max_io_bytes);
/* The thread: fetches every tag, then serves until the kernel aborts
 * the fetches or q->stop is set.  When it ends by itself (the device was
 * stopped from outside, or an error, in q->err), it sends its process
 * SIGTERM, so that the main thread takes the device down. */
int ublk_queue_start (struct ublk_queue *q);
void ublk_queue_join (struct ublk_queue *q);
/* After ublk_offload_stop: a job may still be on a helper until then. */
void ublk_queue_free (struct ublk_queue *q);

#endif
