/* mloop-server — event-loop workers.
 *
 * Thread model: each worker is one thread owning an epoll set, its
 * connections, one kernel AIO context and an eventfd the kernel signals
 * on every completion.  A round of the loop reads every request available
 * on every ready socket, submits all the resulting IO with one io_submit,
 * reaps completions without blocking, and sends every finished reply of a
 * connection with one sendmsg.  No request ever changes thread.
 */
#ifndef MLOOP_SERVER_WORKER_H
#define MLOOP_SERVER_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "stats.h"

struct worker;

struct worker_options {
  struct mloop_engine *engine;
  bool read_only;
  bool discard;
  uint32_t max_request;         /* largest READ/WRITE accepted */
  unsigned ring_depth;          /* AIO requests in flight per worker */
  struct mloop_stats *stats;    /* counters for `mloop status`, or NULL */
};

/* Starts a worker thread.  Returns NULL and a message in ERR on failure. */
struct worker *worker_start (const struct worker_options *opts,
                             char *err, size_t errlen);

/* Hands a negotiated connection to the worker (any thread). */
void worker_add_connection (struct worker *w, int fd);

/* Stops reading requests, answers those already received with ESHUTDOWN,
 * finishes the ones in flight, sends their replies, closes every
 * connection and joins the thread.
 */
void worker_stop (struct worker *w);

#endif /* MLOOP_SERVER_WORKER_H */
