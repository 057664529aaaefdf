/* mloop — whole-buffer IO on blocking sockets, for the NBD handshakes
 * (server and client side).  Both retry after EINTR and short transfers.
 */
#ifndef MLOOP_SOCKIO_H
#define MLOOP_SOCKIO_H

#include <stddef.h>

/* Receives exactly N bytes.  Returns 0, or -1 with errno set; EOF before
 * N bytes is ECONNRESET (the peer hung up mid-message).
 */
int mloop_recv_full (int fd, void *buf, size_t n);

/* Sends all N bytes (never raising SIGPIPE).  Returns 0, or -1. */
int mloop_send_full (int fd, const void *buf, size_t n);

#endif /* MLOOP_SOCKIO_H */
