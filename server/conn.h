/* mloop-server — one client connection in transmission phase.
 *
 * conn.c owns a connection's socket both ways, and its request slots and
 * buffers.  In: each recv takes what the socket holds, every complete
 * header is decoded and decided on before any IO (request.h), a WRITE's
 * payload goes straight into its request's aligned buffer, and reading
 * pauses while the connection has no free slot, its worker's AIO context
 * no room, or the server's buffer budget no bytes to spare (budget.h).
 * Out: finished requests wait on the connection's reply queue, and one
 * sendmsg sends as many of them as the socket takes; on a Unix socket the
 * data of a large READ goes by page reference instead (splice_out.h).  In between, a
 * validated request belongs to dispatch.c, which hands it back with
 * conn_queue_reply().
 *
 * A connection lives on one worker (worker.c), which drives it from its
 * event loop through the conn_set functions below; everything here runs
 * on that worker's thread.
 */
#ifndef MLOOP_SERVER_CONN_H
#define MLOOP_SERVER_CONN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io.h"
#include "offload.h"
#include "session.h"
#include "splice_out.h"
#include "trace.h"
#include "worker.h"

/* Requests a connection may have between receipt and reply: the kernel
 * NBD client's queue depth.
 */
#define CONN_SLOTS 128

struct conn;
struct dispatch;

struct request {
  struct mloop_io io;           /* first: the engine hands back &io */
  struct offload_job job;       /* when run by a helper (offload.h) */
  int result;                   /* the helper's result: 0 or -errno */
  struct conn *conn;
  uint16_t type;
  uint16_t flags;
  uint32_t error;               /* NBD error to reply with */
  void *buf;                    /* aligned; kept for reuse if small */
  size_t cap;
  uint64_t lent_until;          /* buf's pages went into the socket by
                                   reference, up to this stream position
                                   (splice_out.h); 0: not lent */
  bool charged;                 /* buf counts in the budget (budget.h);
                                   else, if buf, in conn->kept */
  size_t data_len;              /* reply payload from buf: READ data,
                                   BLOCK_STATUS descriptors */
  /* The reply's header: a simple reply (16 bytes), or a structured
   * reply chunk with its fixed fields (conn_queue_reply decides).  The
   * cookie is at the same place in both.
   */
  struct {
    uint32_t magic;
    union {
      uint32_t error;           /* simple */
      struct {
        uint16_t flags, type;   /* chunk */
      } __attribute__((packed));
    };
    char cookie[8];             /* opaque, echoed as received */
    uint32_t length;            /* chunk: payload length */
    char fixed[8];              /* chunk: READ's offset, an error and
                                   its message length, a context id */
  } __attribute__((packed)) reply;
  uint8_t reply_len;            /* bytes of reply to send */
  struct request *next;
};

/* Buffers a connection may hold back, lent, until the socket gives
 * their pages back: about what its send buffer and pipe hold of 64 KiB
 * replies.
 */
#define CONN_LENT_MAX 128
/* Of those the socket gave back, how much a connection keeps for its
 * next requests' buffers rather than freeing: a few 1 MiB requests'
 * worth, so large reads cycle through the same pages.
 */
#define CONN_LENT_SPARE (8u << 20)

/* A buffer no slot has any more, still lent to the socket. */
struct lent_buffer {
  void *buf;
  size_t cap;                   /* charged to the server's budget */
  uint64_t until;               /* stream position (splice_out.h) */
};

/* Descriptors one BLOCK_STATUS reply carries at most: the spec lets a
 * server answer less than asked (clients ask again from where it
 * ended), and a fixed size keeps the buffer small and reusable.
 */
#define CONN_EXTENTS_MAX 2048
#define CONN_EXTENTS_BUFFER (CONN_EXTENTS_MAX * 8)

/* The connections of one worker, and what they share.  The worker owns
 * it and calls the conn_set functions; conn.c keeps the lists.
 */
struct conn_set {
  const struct worker_options *opts;
  int epfd;                     /* the worker's epoll set */
  const atomic_bool *stopping;  /* the worker is stopping: requests that
                                   arrive are answered with ESHUTDOWN */
  struct dispatch *dispatch;    /* where validated requests go */
  struct conn *all;
  struct conn *dirty;           /* connections with replies to send */
  /* Connections that may read again and hold unparsed bytes: epoll would
   * not wake the worker for data that has already left the socket.
   */
  struct conn *ready;
  unsigned budget_waiters;      /* connections paused on the budget */
  bool heap_used;               /* buffers allocated or freed since the
                                   worker last gave the heap back */
};

struct conn {
  int fd;
  struct conn_set *set;
  struct session session;       /* what the handshake agreed on */
  struct request *free;         /* slots used before and given back */
  unsigned fresh;               /* slots[fresh..] never used yet */
  unsigned busy;                /* slots given out, not given back */
  unsigned in_kernel;           /* AIO submitted, not yet reaped
                                   (counted by dispatch.c) */
  unsigned in_helpers;          /* offloaded, not yet back (dispatch.c) */
  uint64_t held;                /* buffer bytes charged to the budget */
  uint64_t kept;                /* buffer bytes kept by free slots (still
                                   charged to the server's budget) */

  char *in;                     /* received bytes not yet parsed */
  size_t in_start, in_end;
  struct request *receiving;    /* a WRITE whose payload is arriving */
  size_t payload_done;

  struct request *out_head, *out_tail;
  size_t out_sent;              /* bytes of out_head already sent (or
                                   lent to the pipe) */
  struct splice_out splice;     /* large READ data by page reference */
  /* Buffers waiting for the socket to give their pages back, oldest
   * first, so freeing them in order never waits behind a later one.
   */
  struct lent_buffer lent[CONN_LENT_MAX];
  unsigned lent_first, lent_count;
  uint64_t lent_bytes;          /* their size, all charged to the budget */

  bool reading_paused;          /* no slot, ring room or budget */
  bool budget_wait;             /* paused until the budget allows ... */
  uint32_t budget_need;         /* ... this many bytes more */
  bool want_write;              /* EPOLLOUT armed */
  bool closing;                 /* DISC, EOF or protocol error */
  bool broken;                  /* socket dead: drop replies */
  bool dirty;                   /* on the set's dirty list */
  bool on_ready;                /* on the set's ready list */
  struct conn *next, *next_dirty, *next_ready;
  /* Last, and made ready only as they are first used: a connection
   * costs the pages of the slots it has used, not of all of them (a
   * process holding a thousand idle devices holds four thousand
   * connections, most of which have never had more than a few
   * requests in flight).
   */
  struct request slots[CONN_SLOTS];
};

/* The per-request trace (nbd/trace.h): the connection is named by its
 * descriptor, the request by its cookie.
 */
#define TRACE_REQUEST(event, req, error) \
  MLOOP_TRACE ((event), (unsigned) (req)->conn->fd, (req)->reply.cookie, 0, \
               (req)->type, (req)->io.offset, (req)->io.count, (error))

/* Takes FD, a socket that negotiated SESSION, into S and watches it for
 * requests; on failure closes FD.
 */
void conn_adopt (struct conn_set *s, int fd, const struct session *session);

/* Handles the epoll EVENTS reported for C's socket. */
void conn_handle_events (struct conn *c, uint32_t events);

/* Queues REQ's reply (its header, and the data of a successful READ or
 * BLOCK_STATUS); it goes out at the next conn_set_flush().  Without
 * structured replies, a simple reply; with them, one chunk flagged DONE
 * for a READ, a BLOCK_STATUS or any error, a simple reply for the rest.
 */
void conn_queue_reply (struct request *req, uint32_t nbd_error);

/* Reads, unless the worker is stopping, the connections that resumed
 * with bytes already buffered.
 */
void conn_set_read_ready (struct conn_set *s);

/* Resumes the connections paused for ring room, after a reap. */
void conn_set_resume_for_ring (struct conn_set *s);

/* Resumes the connections whose budget wait is over. */
void conn_set_retry_budget (struct conn_set *s);

/* Sends, with one sendmsg where the socket takes it all, every queued
 * reply of every connection that has some.
 */
void conn_set_flush (struct conn_set *s);

/* On stop: answers the requests each socket already holds with
 * ESHUTDOWN, then reads no more.
 */
void conn_set_refuse_buffered (struct conn_set *s);

/* At the drain deadline: stops sending on every connection, its queued
 * replies dropped at the next flush.  Returns how many connections had
 * replies queued or requests in flight.
 */
unsigned conn_set_break_all (struct conn_set *s);

/* Frees the connections that are closing with nothing left in flight. */
void conn_set_free_closed (struct conn_set *s);

/* Frees the buffers connections parked while lent (splice_out.h) that
 * their sockets have given back: for an idle worker, which flushes
 * nothing that would do it.
 */
void conn_set_free_returned (struct conn_set *s);

/* Frees the buffers idle connections kept for their next requests: for
 * a worker idle a while, whose connections' next requests may be far
 * off (a device nobody uses), so that an idle device holds none.
 */
void conn_set_free_kept (struct conn_set *s);

/* Whether some connection has bytes to parse or replies to send now. */
bool conn_set_has_work (const struct conn_set *s);

#endif /* MLOOP_SERVER_CONN_H */
