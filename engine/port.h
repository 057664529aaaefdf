/* mloop — where a store's completions go when they arrive on its threads.
 *
 * Files complete through the front end's own kernel AIO contexts.  A
 * store with threads of its own (librbd's) completes a request there,
 * and posts it to the port the submitter named in io->port; the front
 * end then hands it to mloop_engine_complete_event() on the thread that
 * owns the request, as if it had reaped it from AIO.
 *
 * Two kinds of port:
 *   - a queue (mloop_port_queue) for event loops: post pushes the request
 *     onto a lock-free list and signals an eventfd the loop already
 *     polls (the one its AIO contexts signal), so a completion costs one
 *     eventfd write and no thread handoff beyond the store's own;
 *   - any other post function, e.g. one that completes the request on
 *     the posting thread (pooled.c, whose callers wait on a condition).
 *
 * Why not librbd's own eventfd (rbd_set_image_notification): it is one
 * per open image, and a server's several event loops share one image
 * (two opens of an image in one process would fight over its
 * exclusive lock).
 */
#ifndef MLOOP_PORT_H
#define MLOOP_PORT_H

#include "io.h"

struct mloop_port {
  /* Called once per request, on any thread; must not block.  RES is
   * what mloop_engine_complete_event() takes (a byte count or a negative
   * errno).
   */
  void (*post) (struct mloop_port *port, struct mloop_io *io, long res);
};

struct mloop_port_queue {
  struct mloop_port port;       /* first: io->port points here */
  struct mloop_io *head;        /* atomic; newest first */
  int efd;                      /* written once per post */
};

/* Completions posted to Q are announced on EFD (not owned). */
void mloop_port_queue_init (struct mloop_port_queue *q, int efd);

/* Hands every request posted to Q so far to FN, oldest first, with the
 * result its store posted (what mloop_engine_complete_event() takes).
 * On the owning thread, after the eventfd woke it.  FN may submit the
 * request again (a short transfer's rest) or post to Q: what arrives
 * meanwhile is left for the next drain, which the eventfd announces.
 */
typedef void (*mloop_port_fn) (void *opaque, struct mloop_io *io, long res);
void mloop_port_queue_drain (struct mloop_port_queue *q, mloop_port_fn fn,
                             void *opaque);

#endif /* MLOOP_PORT_H */
