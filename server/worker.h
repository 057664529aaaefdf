/* mloop-server — event-loop workers.
 *
 * Thread model: each worker is one thread owning an epoll set, its
 * connections (conn.h), one kernel AIO context and an eventfd the kernel
 * signals on every completion (dispatch.h).  A round of the loop reads
 * every request available on every ready socket, submits all the
 * resulting IO with one io_submit, reaps completions without blocking,
 * and sends every finished reply of a connection with one sendmsg.  A
 * request is received, completed and replied to on its worker's thread;
 * only work that must block leaves it, for a helper, and comes back
 * (offload.h).
 */
#ifndef MLOOP_SERVER_WORKER_H
#define MLOOP_SERVER_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "budget.h"
#include "engine.h"
#include "offload.h"
#include "session.h"
#include "stats.h"

struct worker;

struct worker_options {
  struct mloop_engine *engine;
  bool read_only;
  bool discard;
  uint32_t max_request;         /* largest READ/WRITE accepted */
  unsigned ring_depth;          /* AIO requests in flight per worker */
  struct mloop_stats *stats;    /* counters for `mloop status`, or NULL */
  struct budget *budget;        /* request buffers, shared by all workers */
  struct offload *offload;      /* helpers for blocking commands */
  struct offload_tenant *offload_tenant;        /* whose jobs they are
                                                   (the image's) */
  unsigned drain_timeout;       /* seconds to finish replies on stop */
  bool splice_replies;          /* large READ data to Unix sockets by page
                                   reference (splice_out.h), not copied */
  /* Closes a client's socket: the server's counts it out of its caps
   * (admission.h).  NULL: close(2).
   */
  void (*close_client) (int fd);
};

/* Closes client socket FD as OPTS says. */
void worker_close_client (const struct worker_options *opts, int fd);

/* Starts a worker thread.  Returns NULL and a message in ERR on failure. */
struct worker *worker_start (const struct worker_options *opts,
                             char *err, size_t errlen);

/* Hands a negotiated connection, and what it negotiated, to the worker
 * (any thread).
 */
void worker_add_connection (struct worker *w, int fd,
                            const struct session *session);

/* Tells the worker to stop (returns at once): it stops reading requests,
 * answers those already received with ESHUTDOWN, finishes the ones in
 * flight and sends their replies.  Replies still unsent after
 * drain_timeout seconds (a client that does not read them) are dropped.
 * Then it closes every connection.
 */
void worker_begin_stop (struct worker *w);

/* worker_begin_stop(), then waits for the worker and frees it. */
void worker_stop (struct worker *w);

#endif /* MLOOP_SERVER_WORKER_H */
