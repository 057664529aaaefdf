/* mloop-server — a connection's byte stream: the socket itself, or TLS
 * over it.
 *
 * A plain connection has no transport ops: every call below is then the
 * socket call it always was, behind one branch, so the plain path costs
 * no copy and no indirection.  TLS (tls.c, GnuTLS) plugs in through
 * struct transport_ops, so the protocol code (handshake.c, conn.c) never
 * calls GnuTLS and the libraries it lives in need no GnuTLS to build.
 */
#ifndef MLOOP_SERVER_TRANSPORT_H
#define MLOOP_SERVER_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

struct transport_ops {
  /* Blocking, for the handshake: all N bytes, or -1 (EOF is
   * ECONNRESET).
   */
  int (*recv_full) (void *ctx, void *buf, size_t n);
  int (*send_full) (void *ctx, const void *buf, size_t n);
  /* Non-blocking, for transmission, with recv(2) and sendmsg(2)'s
   * results: -1 with errno EAGAIN when nothing can move now (after an
   * EAGAIN, sendv must be called again before anything else is sent:
   * conn.c does, with the same unsent bytes first), 0 for EOF.
   */
  ssize_t (*recv) (void *ctx, void *buf, size_t n);
  ssize_t (*sendv) (void *ctx, const struct iovec *iov, size_t n);
  /* Whether received bytes wait decoded in the transport: epoll will
   * not report them.
   */
  bool (*pending) (void *ctx);
  /* Ends the stream best effort without blocking, and frees CTX (not
   * the socket).
   */
  void (*close) (void *ctx);
};

struct transport {
  const struct transport_ops *ops;      /* NULL: the plain socket */
  void *ctx;
};

static inline ssize_t
transport_recv (const struct transport *t, int fd, void *buf, size_t n)
{
  if (t->ops == NULL)
    return recv (fd, buf, n, MSG_DONTWAIT);
  return t->ops->recv (t->ctx, buf, n);
}

static inline ssize_t
transport_sendmsg (const struct transport *t, int fd, const struct msghdr *m)
{
  if (t->ops == NULL)
    return sendmsg (fd, m, MSG_NOSIGNAL | MSG_DONTWAIT);
  return t->ops->sendv (t->ctx, m->msg_iov, m->msg_iovlen);
}

static inline bool
transport_pending (const struct transport *t)
{
  return t->ops && t->ops->pending (t->ctx);
}

/* Blocking whole-buffer IO for the handshake. */
int transport_recv_full (const struct transport *t, int fd, void *buf,
                         size_t n);
int transport_send_full (const struct transport *t, int fd, const void *buf,
                         size_t n);

/* Ends TLS, if any (best effort, never blocking); the socket stays open. */
void transport_close (struct transport *t);

/* transport_close() of a stream held in a const place, not used again. */
static inline void
transport_close_copy (const struct transport *t)
{
  struct transport copy = *t;

  transport_close (&copy);
}

#endif /* MLOOP_SERVER_TRANSPORT_H */
