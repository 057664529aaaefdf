/* mloop — where a store's completions go.  See port.h. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "port.h"

static void
queue_post (struct mloop_port *port, struct mloop_io *io, long res)
{
  struct mloop_port_queue *q = (struct mloop_port_queue *) port;
  struct mloop_io *head = __atomic_load_n (&q->head, __ATOMIC_RELAXED);
  const uint64_t one = 1;

  io->posted_res = res;
  do
    io->posted_next = head;
  while (!__atomic_compare_exchange_n (&q->head, &head, io, true,
                                       __ATOMIC_RELEASE, __ATOMIC_RELAXED));
  /* Only a counter at its maximum refuses a write, and a loop reads it
   * back to zero every time it wakes.
   */
  if (write (q->efd, &one, sizeof one) != sizeof one)
    abort ();
}

void
mloop_port_queue_init (struct mloop_port_queue *q, int efd)
{
  q->port.post = queue_post;
  q->head = NULL;
  q->efd = efd;
}

void
mloop_port_queue_drain (struct mloop_port_queue *q, mloop_port_fn fn,
                        void *opaque)
{
  struct mloop_io *newest = __atomic_exchange_n (&q->head, NULL,
                                                 __ATOMIC_ACQUIRE);
  struct mloop_io *oldest = NULL;

  while (newest) {              /* reverse: completion order */
    struct mloop_io *next = newest->posted_next;

    newest->posted_next = oldest;
    oldest = newest;
    newest = next;
  }
  while (oldest) {              /* FN may reuse posted_next */
    struct mloop_io *next = oldest->posted_next;

    fn (opaque, oldest, oldest->posted_res);
    oldest = next;
  }
}
