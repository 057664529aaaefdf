/* mloop — one IO request to the engine, and how it completes.
 *
 * A front end (the nbdkit plugin, the native server) fills in the public
 * fields, submits the request, and later receives exactly one call of
 * 'complete'.  The request must stay valid until then; the engine owns the
 * private fields in between.
 */
#ifndef MLOOP_IO_H
#define MLOOP_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <libaio.h>

enum mloop_io_op {
  MLOOP_IO_READ,
  MLOOP_IO_WRITE,
  MLOOP_IO_FLUSH,               /* fdatasync of everything completed so far */
};

/* Flags for mloop_io.flags. */
#define MLOOP_IO_FUA  (1u << 0)  /* write: durable before completion */

struct mloop_io;
struct mloop_port;
struct mloop_store;
typedef void (*mloop_io_complete_fn) (struct mloop_io *io, int error);

struct mloop_io {
  /* Set by the submitter. */
  enum mloop_io_op op;
  unsigned flags;
  void *buf;
  size_t count;
  uint64_t offset;
  /* Called once, from whichever thread reaped the request: ERROR is 0 on
   * success or a positive errno (EIO, ENOSPC, ...).  Must not block.
   */
  mloop_io_complete_fn complete;
  void *opaque;
  /* Optional: an aligned buffer of scratch_size bytes the engine may use
   * as the bounce buffer instead of allocating one, when buf is not
   * aligned for O_DIRECT.  Must stay untouched until completion.
   */
  void *scratch;
  size_t scratch_size;
  /* Where the store posts IO's completion when it completes on a thread
   * of its own (port.h, MLOOP_PREPARED_QUEUED).  Required by stores that
   * do (RBD); files never use it.
   */
  struct mloop_port *port;

  /* Engine private. */
  struct iocb iocb;
  int fd;                       /* descriptor chosen for this request */
  uint64_t file_base;           /* fd's file offset of offset 0 */
  size_t done;                  /* bytes transferred, for short transfers */
  void *bounce;                 /* aligned copy of buf, when buf is not */
  bool bounce_allocated;        /* bounce is ours to free (not scratch) */
  struct iovec iov;
  struct mloop_store *taken_by; /* the store that took IO (QUEUED) */
  struct mloop_io *posted_next; /* a port's queue (port.h) */
  long posted_res;              /* the result the store posted */
};

/* What the kernel's completion of an IO leaves to do. */
enum mloop_event_result {
  MLOOP_EVENT_DONE,             /* request completed; slot is free */
  MLOOP_EVENT_RESUBMIT,         /* iocb re-prepared; submit it again */
};

#endif /* MLOOP_IO_H */
