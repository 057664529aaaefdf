/* The fuzz targets' client.  See client.h. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "client.h"

static void
append (struct fuzz_client *c, const uint8_t *p, size_t n)
{
  if (c->out_len + n > c->out_cap) {
    size_t cap = c->out_cap ? 2 * c->out_cap : 4096;

    while (cap < c->out_len + n)
      cap *= 2;
    c->out = realloc (c->out, cap);
    if (c->out == NULL)
      abort ();
    c->out_cap = cap;
  }
  memcpy (c->out + c->out_len, p, n);
  c->out_len += n;
}

/* Sends and reads at the same time, so neither side can block the other
 * on a full socket buffer; returns at the server's EOF.
 */
static void *
client_main (void *arg)
{
  struct fuzz_client *c = arg;
  size_t sent = 0;
  bool shut = false;

  for (;;) {
    struct pollfd p = { .fd = c->fd, .events = POLLIN };
    uint8_t buf[65536];

    if (!shut && sent == c->in_len) {
      if (c->end == FUZZ_CLIENT_HANG_UP) {
        shutdown (c->fd, SHUT_RDWR);    /* the server's sends now fail */
        break;
      }
      if (c->end == FUZZ_CLIENT_SHUT_WR)
        shutdown (c->fd, SHUT_WR);
      shut = true;              /* done sending, either way */
    }
    if (!shut)
      p.events |= POLLOUT;
    if (poll (&p, 1, -1) == -1) {
      if (errno == EINTR)
        continue;
      abort ();
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = recv (c->fd, buf, sizeof buf, MSG_DONTWAIT);

      if (r > 0)
        append (c, buf, (size_t) r);
      else if (r == 0 || (errno != EAGAIN && errno != EINTR))
        break;                  /* the server closed */
    }
    if (!shut && (p.revents & POLLOUT)) {
      ssize_t r = send (c->fd, c->in + sent, c->in_len - sent,
                        MSG_DONTWAIT | MSG_NOSIGNAL);

      if (r > 0)
        sent += (size_t) r;
      else if (r == -1 && errno != EAGAIN && errno != EINTR)
        sent = c->in_len;       /* the server stopped reading */
    }
  }
  return NULL;
}

void
fuzz_client_start (struct fuzz_client *c, int fd, const uint8_t *in,
                   size_t in_len, enum fuzz_client_end end)
{
  memset (c, 0, sizeof *c);
  c->fd = fd;
  c->in = in;
  c->in_len = in_len;
  c->end = end;
  if (pthread_create (&c->thread, NULL, client_main, c) != 0)
    abort ();
}

void
fuzz_client_join (struct fuzz_client *c)
{
  pthread_join (c->thread, NULL);
  close (c->fd);
}
