/* mloop-server — one client connection in transmission phase, owned by
 * one worker: request parsing, validation, and the reply queue.
 */
#ifndef MLOOP_SERVER_CONNECTION_H
#define MLOOP_SERVER_CONNECTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io.h"
#include "offload.h"
#include "trace.h"

/* Requests a connection may have between receipt and reply: the kernel
 * NBD client's queue depth.
 */
#define CONN_SLOTS 128
#define CONN_INBUF (64 * 1024)

struct conn;
struct worker;

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
  bool charged;                 /* buf counts in the budget (budget.h);
                                   else, if buf, in conn->kept */
  size_t data_len;              /* reply payload: READ data */
  struct {
    uint32_t magic;
    uint32_t error;
    char cookie[8];             /* opaque, echoed as received */
  } __attribute__((packed)) reply;
  struct request *next;
};

struct conn {
  int fd;
  struct worker *worker;
  struct request slots[CONN_SLOTS];
  struct request *free;
  unsigned busy;                /* slots not on the free list */
  unsigned in_kernel;           /* AIO submitted, not yet reaped */
  unsigned in_helpers;          /* offloaded, not yet back */
  uint64_t held;                /* buffer bytes charged to the budget */
  uint64_t kept;                /* buffer bytes kept by free slots */

  char *in;                     /* received bytes not yet parsed */
  size_t in_start, in_end;
  struct request *receiving;    /* a WRITE whose payload is arriving */
  size_t payload_done;

  struct request *out_head, *out_tail;
  size_t out_sent;              /* bytes of out_head already sent */

  bool reading_paused;          /* no slot, ring room or budget */
  bool budget_wait;             /* paused until the budget allows ... */
  uint32_t budget_need;         /* ... this many bytes more */
  bool want_write;              /* EPOLLOUT armed */
  bool closing;                 /* DISC, EOF or protocol error */
  bool broken;                  /* socket dead: drop replies */
  bool dirty;                   /* on the worker's flush list */
  bool on_ready;                /* on the worker's ready list */
  struct conn *next, *next_dirty, *next_ready;
};

/* The per-request trace (nbd/trace.h): the connection is named by its
 * descriptor, the request by its cookie.
 */
#define TRACE_REQUEST(event, req, error) \
  MLOOP_TRACE ((event), (unsigned) (req)->conn->fd, (req)->reply.cookie, 0, \
               (req)->type, (req)->io.offset, (req)->io.count, (error))

#endif /* MLOOP_SERVER_CONNECTION_H */
