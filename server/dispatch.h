/* mloop-server — taking a validated request to the engine, for one
 * worker.
 *
 * READ, WRITE and FLUSH are prepared by the engine and gathered into a
 * batch that goes to the worker's own kernel AIO context with one
 * io_submit per round of its loop; completions are reaped without
 * blocking when the kernel signals the context's eventfd, so the loop
 * never waits for the disk.  What has no asynchronous form (TRIM,
 * WRITE_ZEROES, and whatever the engine says must block) goes to a helper
 * thread (offload.h) and comes back through the worker's inbox of
 * finished jobs.  Either way the request ends in conn_queue_reply(), on
 * the worker's thread.
 *
 * The worker owns a struct dispatch and watches its two eventfds; the
 * connections (conn.c) hand it their requests once request_check() has
 * passed them.
 */
#ifndef MLOOP_SERVER_DISPATCH_H
#define MLOOP_SERVER_DISPATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "aio_ring.h"
#include "engine.h"
#include "offload.h"

struct request;

/* The AIO context a worker opens when its first request arrives, and
 * the smallest it settles for when fs.aio-max-nr is short.  It doubles,
 * up to --queue-depth, each time its requests fill it: an idle device
 * reserves nothing, a lightly used one little (docs/design.md, "What a
 * device reserves").
 */
#define DISPATCH_RING_FIRST 32

struct dispatch {
  struct mloop_engine *engine;
  struct offload *offload;      /* helpers for blocking commands */
  struct offload_tenant *tenant;        /* whose jobs they are */
  unsigned ring_depth;          /* the most AIO requests in flight
                                   (--queue-depth): the ring grows to it */
  unsigned depth;               /* requests in flight allowed now: the
                                   ring's depth, or the one it will open
                                   with */
  struct mloop_aio_ring ring;   /* ctx 0 until the first request */
  unsigned ring_in_flight;      /* submitted to ring, not reaped */
  struct mloop_aio_ring old;    /* the ring before it grew, until what
                                   it holds is reaped */
  unsigned old_in_flight;
  int64_t retry_ms;             /* the limit refused a ring: not again
                                   before this (CLOCK_MONOTONIC) */
  int aio_efd;                  /* signalled by the kernel per completion */
  /* Completions of a store with threads of its own (RBD), announced on
   * aio_efd too.
   */
  struct mloop_port_queue port;
  struct iocb **batch;          /* prepared, not yet submitted */
  unsigned batch_len;
  unsigned in_kernel;           /* requests submitted, not reaped */
  unsigned in_helpers;          /* requests offloaded, not yet back */
  struct offload_inbox done;    /* offloaded requests coming back */
  bool ack_flush_early;         /* MLOOP_TEST_ACK_FLUSH_EARLY=1: broken on
                                   purpose, see dispatch_init() */
};

/* Whether MLOOP_TEST_ACK_FLUSH_EARLY=1 asks for FLUSH to be answered
 * without being done (a test-only way to break the server on purpose).
 */
bool mloop_test_ack_flush_early (void);

/* Sets D up and opens its eventfds; its AIO context waits for the first
 * request.  Its helpers' jobs are TENANT's (offload.h; NULL: the
 * pool's own).  Returns -1 with errno set.
 */
int dispatch_init (struct dispatch *d, struct mloop_engine *engine,
                   struct offload *offload, struct offload_tenant *tenant,
                   unsigned ring_depth);
/* Closes D's AIO contexts (a request after this opens one again), on
 * the thread that ends: see worker_main.
 */
void dispatch_close_rings (struct dispatch *d);
/* Closes what dispatch_init() opened; nothing may be in flight. */
void dispatch_destroy (struct dispatch *d);

/* Performs REQ, which request_check() has passed: its reply is queued
 * when the IO is done, which may be before this returns.
 */
void dispatch_request (struct dispatch *d, struct request *req,
                       uint64_t offset, uint32_t length);

/* Whether the AIO context may take no more requests this round.  A full
 * context first tries to grow.
 */
bool dispatch_ring_full (struct dispatch *d);

/* Submits the round's batch, if any: one io_submit, unless the kernel
 * refuses an iocb: that request alone then fails.
 */
void dispatch_submit (struct dispatch *d);

/* Reaps, without blocking, what the kernel completed (when aio_efd
 * fires), and resubmits what a short transfer left.
 */
void dispatch_reap (struct dispatch *d);

/* Completes what the helpers finished (when done.efd fires). */
void dispatch_take_done (struct dispatch *d);

/* Whether nothing is in the kernel or with a helper. */
bool dispatch_idle (const struct dispatch *d);

#endif /* MLOOP_SERVER_DISPATCH_H */
