/* mloop-server — READ data sent to a Unix socket by page reference.
 *
 * A reply's data would otherwise be copied by sendmsg into pages the
 * socket allocates (and, on kernels built with init_on_alloc, zeroes
 * first), then copied again by the reader.  Here the data goes into a
 * pipe by reference (vmsplice), and from the pipe into the socket by
 * reference (splice: unix_stream_sendpage on Linux 6.1, MSG_SPLICE_PAGES
 * from 6.5): the reader's copy is the only one.
 *
 * The socket then holds our buffer's pages until the reader has taken
 * the bytes, so a buffer is lent: it may be written again only once
 * splice_out_returned() says so.  SIOCOUTQ on a Unix socket counts the
 * memory of the sent messages the peer has not yet consumed (at least
 * their bytes), and the peer consumes in order: once fewer than
 * (bytes sent - a buffer's end) remain, every message holding the buffer
 * is gone.  A buffer still lent when its slot needs it again has its
 * pages dropped from our mapping instead (splice_out_forget); the socket
 * keeps the old ones and the slot faults in fresh ones.
 *
 * Only plain Unix stream sockets: on TCP, SIOCOUTQ counts unacknowledged
 * bytes, and an acknowledged segment may still sit unread in a loopback
 * peer's queue with our pages; TLS encrypts into its own buffers anyway.
 */
#ifndef MLOOP_SERVER_SPLICE_OUT_H
#define MLOOP_SERVER_SPLICE_OUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* READ data from this size up goes by reference; smaller data rides in
 * the sendmsg with the headers, where one call carries many replies.
 */
#define SPLICE_OUT_MIN (64 * 1024)

struct splice_out {
  int pipe_rd, pipe_wr;         /* -1: this connection copies */
  size_t in_pipe;               /* bytes in the pipe, not yet in the
                                   socket: they go before anything else */
  uint64_t to_socket;           /* bytes ever written into the socket */
};

/* Whether this process may splice into a Unix socket at all: one page
 * lent and spliced through a socket pair, read back and compared.  A
 * seccomp filter (systemd's SystemCallFilter=) or a kernel without
 * vmsplice makes it fail; the reason is then in errno.  The server asks
 * once at start and copies every reply if it may not.
 */
bool splice_out_works (void);

/* Sets Z up for socket FD.  Returns 1 when Z splices; 0 when FD is not
 * a Unix stream socket, and -1 with errno when it is but no pipe could
 * be had: then Z copies (pipe_rd == -1).
 */
int splice_out_open (struct splice_out *z, int fd);

void splice_out_close (struct splice_out *z);

static inline bool
splice_out_enabled (const struct splice_out *z)
{
  return z->pipe_rd != -1;
}

/* Lends LEN bytes at BUF (page-aligned start and length) to the pipe:
 * how many it took (0 when full), or -1 with errno.  The stream position
 * where what it took ends is z->to_socket + z->in_pipe afterwards.
 */
ssize_t splice_out_lend (struct splice_out *z, const void *buf, size_t len);

/* Moves what the pipe holds into socket FD: 0 when the pipe is empty,
 * 1 when the socket is full (EAGAIN; wait for EPOLLOUT), -1 with errno
 * when the socket is dead.
 */
int splice_out_drain (struct splice_out *z, int fd);

/* Counts LEN bytes written to socket FD by other means (sendmsg). */
static inline void
splice_out_count (struct splice_out *z, size_t len)
{
  z->to_socket += len;
}

/* Whether the socket has given back every page lent up to stream
 * position END.
 */
bool splice_out_returned (const struct splice_out *z, int fd, uint64_t end);

/* Drops BUF's pages (CAP bytes, page-aligned and whole pages) from our
 * mapping, for a buffer still lent that must be written or freed: the
 * socket keeps its pages, we get fresh zero-filled ones.
 */
void splice_out_forget (void *buf, size_t cap);

#endif /* MLOOP_SERVER_SPLICE_OUT_H */
