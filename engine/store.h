/* mloop — a backing store: the one interface behind the engine.
 *
 * The engine serves one store: an image file or block device
 * (file_store.c, through kernel AIO) or an image in a distributed store
 * (rbd_store.c, through librbd, a module loaded only for "rbd:" names).
 * Front ends never see which: engine.h forwards every call to the store's
 * operations below, and its accessors read the store's description.
 * A new kind of store is one more table of these operations, as nbdkit
 * plugins and ublksrv targets are, never a branch in a front end.
 *
 * Each operation has the contract of the engine.h or space.h function of
 * the same name, with the store in place of the engine.  A store whose
 * IO completes on threads of its own (librbd's) answers prepare with
 * MLOOP_PREPARED_QUEUED and posts each completion to io->port (port.h).
 */
#ifndef MLOOP_STORE_H
#define MLOOP_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io.h"
#include "space.h"

struct mloop_store;

struct mloop_store_ops {
  const char *kind;             /* "file", "rbd": for messages */

  void (*probe_features) (struct mloop_store *s);
  /* Waits until every request the store took (MLOOP_PREPARED_QUEUED) has
   * been posted to its port; NULL for a store that takes none.
   */
  void (*quiesce) (struct mloop_store *s);
  void (*close) (struct mloop_store *s);

  /* The request path (engine.h). */
  int (*prepare) (struct mloop_store *s, struct mloop_io *io);
  int (*perform_blocking) (struct mloop_store *s, struct mloop_io *io);
  void (*complete_blocking) (struct mloop_store *s, struct mloop_io *io,
                             int result);
  long (*perform_event) (struct mloop_store *s, struct mloop_io *io);
  void (*abandon) (struct mloop_store *s, struct mloop_io *io);
  enum mloop_event_result (*complete_event) (struct mloop_store *s,
                                             struct mloop_io *io, long res);
  int (*flush) (struct mloop_store *s);

  /* Space (space.h), on threads that may block. */
  int (*trim) (struct mloop_store *s, uint64_t offset, uint64_t count,
               unsigned flags);
  int (*zero) (struct mloop_store *s, uint64_t offset, uint64_t count,
               unsigned flags);
  int (*extents) (struct mloop_store *s, uint64_t offset, uint64_t count,
                  bool req_one, mloop_extent_fn fn, void *opaque);

  int (*reprobe_size) (struct mloop_store *s, char *err, size_t errlen);
  /* The store's size now: may change under IO threads (reprobe_size). */
  uint64_t (*size) (const struct mloop_store *s);
  /* One line for a server's start-up log: what is served and how. */
  void (*describe) (const struct mloop_store *s, char *buf, size_t len);
  /* Makes the image SIZE bytes (`mloop resize --size`): grows it, or
   * cuts off its end.  0, or a negative errno with the reason in ERR.
   */
  int (*set_size) (struct mloop_store *s, uint64_t size, char *err,
                   size_t errlen);
};

/* What a store settles when it opens and front ends ask about. */
struct mloop_store_info {
  bool writable;
  /* The alignment clients that align for speed should follow (the NBD
   * preferred block size; mloop attach's logical block size).
   */
  uint32_t preferred_block_size;
  /* The alignment of buffers the store takes without a copy (1: any). */
  uint32_t buffer_alignment;
  bool direct;                  /* no page cache between us and the data */
  bool direct_fell_back;        /* direct=auto had to do without */
  /* Whether the store reports holes (block devices do not; everything
   * there is data), so a front end can say it knows nothing rather
   * than report all data.
   */
  bool can_extents;
  bool is_block_device;
};

/* Every store's state starts with this. */
struct mloop_store {
  const struct mloop_store_ops *ops;
  struct mloop_store_info info;
};

#endif /* MLOOP_STORE_H */
