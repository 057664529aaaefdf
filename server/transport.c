/* mloop-server — a connection's byte stream.  See transport.h. */
#include "sockio.h"
#include "transport.h"

int
transport_recv_full (const struct transport *t, int fd, void *buf, size_t n)
{
  if (t->ops == NULL)
    return mloop_recv_full (fd, buf, n);
  return t->ops->recv_full (t->ctx, buf, n);
}

int
transport_send_full (const struct transport *t, int fd, const void *buf,
                     size_t n)
{
  if (t->ops == NULL)
    return mloop_send_full (fd, buf, n);
  return t->ops->send_full (t->ctx, buf, n);
}

void
transport_close (struct transport *t)
{
  if (t->ops)
    t->ops->close (t->ctx);
  t->ops = NULL;
  t->ctx = NULL;
}
