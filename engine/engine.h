/* mloop — the IO engine: a backing store served through asynchronous IO.
 *
 * This is the interface every front end stands on.  The engine serves one
 * store (store.h): an image file or block device through kernel AIO
 * (file_store.h), or a Ceph RBD image through librbd (rbd_store.c).  It
 * decides how each request reaches the store and completes it; it owns
 * no AIO context and no thread of its own.  Who submits and reaps is the
 * front end's choice: mloop-server's event loops own one AIO context
 * each; the nbdkit plugin's threads submit to a pool of them (pooled.h).
 *
 *   mloop_engine_open()   at configuration time: opens and probes the
 *                         store (for files: no threads, no AIO contexts,
 *                         so it is safe before a daemonizing fork);
 *   mloop_engine_probe_features()  in the process that will serve;
 *   mloop_engine_prepare() ... mloop_engine_complete_event()  per request;
 *   mloop_engine_close().
 *
 * Errors, for the whole engine library (this folder): functions return
 * 0 (or a count) on success and a negative errno on failure; those that
 * can fail for a reason worth a sentence (opening, starting) also write a
 * one-line message into a caller-supplied buffer; only the allocator,
 * returning a pointer, says NULL with errno set.  The library never
 * prints and never exits.
 */
#ifndef MLOOP_ENGINE_H
#define MLOOP_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backing.h"
#include "io.h"
#include "overlay.h"
#include "port.h"
#include "store.h"

/* The largest request the engine accepts (nbdkit's own limit is 64 MiB). */
#define MLOOP_MAX_REQUEST          (64u * 1024 * 1024)

/* Names of the form "rbd:POOL/IMAGE[@SNAP]" are Ceph RBD images; any
 * other path is a file or block device ("./rbd:x" is a file).
 */
#define MLOOP_RBD_PREFIX "rbd:"
#define MLOOP_RBD_DEFAULT_POOL "rbd"    /* "rbd:IMAGE" is rbd:rbd/IMAGE */

struct mloop_engine_config {
  const char *path;             /* a file, a block device or an rbd: name */
  enum mloop_direct_mode direct;
  bool want_write;
  struct mloop_window window;   /* all zero: the whole file */
  /* A copy-on-write overlay (overlay.h) to write to, made when there is
   * no file at this path; the store at 'path' is then only read.  NULL:
   * none.
   */
  const char *overlay;
  /* Serve the overlay over 'path' even when it was made for another
   * image of that size, and record 'path' as its base from now on.
   */
  bool overlay_adopt_base;
  /* The overlay must be there already: none at 'overlay' is refused
   * (-ENOENT), never made.  For every start of a device's server but
   * the first: an empty overlay made under a device in use would have
   * it read the base's bytes, the writes it was answered gone.
   */
  bool overlay_must_exist;
  /* For an rbd: store.  NULL: what librados finds by itself
   * ($CEPH_CONF, /etc/ceph/ceph.conf; client.admin or $CEPH_ARGS).
   */
  const char *ceph_conf;
  const char *ceph_id;          /* the cephx user, without "client." */
  /* Serve without taking the image's exclusive lock: another writer may
   * use the image at the same time (a cluster filesystem's business).
   * An rbd: name's ":shared=off" does not take it back (mloop resize
   * opens a device's image so, beside the server holding the lock).
   */
  bool shared;
  /* Where the servers of one device record the holder of an rbd:
   * image's exclusive lock, or NULL.  A server that finds the lock held
   * by the holder recorded there (its predecessor, killed) breaks it at
   * once, where librbd would wait for the OSD to time the dead holder's
   * watch out (30 s: longer than IO waits for a restart).  Beside it,
   * in LOCK_RECORD.image, the first records the ids of the image and
   * snapshot it opened, and the later ones open those, whatever has the
   * name by then (`rbd mv`).
   */
  const char *lock_record;
  /* Seconds a request may wait for a store whose IO can wait on a
   * network (an rbd: image's cluster) before it fails with EIO; 0: wait
   * as long as the store does (librados: until the cluster answers).
   * The file store ignores it: a local disk's requests end by
   * themselves, or the kernel's own timeouts end them.
   */
  unsigned io_timeout;
  /* Where a store says, in one line without a newline, how it fares
   * while it serves: an rbd: store that its cluster did not answer
   * within io_timeout, and that it answers again.  Once per change, not
   * per request; on any thread (librbd's among them).  NULL: unsaid.
   */
  void (*notice) (const char *line);
};

struct mloop_engine {
  struct mloop_store *store;
};

void mloop_engine_config_init (struct mloop_engine_config *cfg);

int mloop_engine_open (struct mloop_engine *e,
                       const struct mloop_engine_config *cfg,
                       char *err, size_t errlen);
/* Probes what the store can do asynchronously (for files, whether the
 * kernel takes RWF_DSYNC on AIO writes and AIO fdatasync), with IO of
 * its own: call it in the process that will serve, before the first
 * request.
 */
void mloop_engine_probe_features (struct mloop_engine *e);

/* Waits until no request the store took (MLOOP_PREPARED_QUEUED) is
 * still to be posted to its port: for a front end whose threads stopped
 * with requests in flight, before its ports go away.
 */
void mloop_engine_quiesce (struct mloop_engine *e);

void mloop_engine_close (struct mloop_engine *e);

/* Makes every completed write durable, on the calling thread: for
 * callers whose writes have all completed (pooled.h's flush) and for
 * blocking flushes.  0 or a negative errno.
 */
int mloop_engine_flush (struct mloop_engine *e);

/* Reads the size of the store again (mloop_backing_reprobe_size).  An
 * overlay's device keeps the size the overlay was made with: -ENOTSUP,
 * with the reason in ERR.
 */
int mloop_engine_reprobe_size (struct mloop_engine *e, char *err,
                               size_t errlen);

/* Makes the image itself SIZE bytes, for `mloop resize --size` (a file
 * is truncated or extended, an RBD image resized); the engine serves the
 * new size at once.  A block device, a window (--offset/--sizelimit) or
 * an overlay's device cannot be resized this way: -ENOTSUP.  0, or a
 * negative errno with a one-line reason in ERR.
 */
int mloop_engine_set_size (struct mloop_engine *e, uint64_t size, char *err,
                           size_t errlen);

/* What front ends need to know of the store (store.h's info). */
uint64_t mloop_engine_size (const struct mloop_engine *e);
static inline const struct mloop_store_info *
mloop_engine_info (const struct mloop_engine *e)
{
  return &e->store->info;
}
/* One line saying what is served and how, for a start-up log. */
void mloop_engine_describe (const struct mloop_engine *e, char *buf,
                            size_t len);

/* The path of one request:
 *
 * mloop_engine_prepare() validates IO and fills io->iocb.  Returns
 * MLOOP_PREPARED_AIO when the iocb must be submitted (to the caller's own
 * context), MLOOP_PREPARED_DONE when IO was completed already
 * (io->complete has run), MLOOP_PREPARED_BLOCKING when IO has no
 * asynchronous form (below), or a negative errno when IO was refused up
 * front (complete is not called): out of range (EINVAL for reads, ENOSPC
 * for writes), EPERM writing a read-only store, EINVAL for a request
 * over MLOOP_MAX_REQUEST.
 *
 * Blocking IO (a read-modify-write of an unaligned request, the
 * page-cache tail of an odd-sized file, fdatasync where AIO has none):
 * mloop_engine_perform_blocking() does it and returns 0 or a negative
 * errno, on any thread that may block (an event loop hands it to a
 * helper); mloop_engine_complete_blocking() then completes IO with that
 * result, on the thread that owns IO.
 *
 * mloop_engine_complete_event() handles the kernel's result RES for IO
 * (an io_event's res; its data field is IO).  Returns MLOOP_EVENT_DONE
 * once io->complete has run, or MLOOP_EVENT_RESUBMIT after a short
 * transfer, when io->iocb must be submitted again.
 *
 * mloop_engine_perform_event() does what the kernel would do with the
 * iocb of IO prepared for AIO, synchronously on the calling thread (one
 * that may block), and returns that RES: for a front end with no room
 * in an AIO context (fs.aio-max-nr reached), whose result then goes to
 * mloop_engine_complete_event() as if reaped.
 */
enum {
  MLOOP_PREPARED_DONE = 0,
  MLOOP_PREPARED_AIO = 1,
  MLOOP_PREPARED_BLOCKING = 2,
  MLOOP_PREPARED_QUEUED = 3,
};
int mloop_engine_prepare (struct mloop_engine *e, struct mloop_io *io);
int mloop_engine_perform_blocking (struct mloop_engine *e,
                                   struct mloop_io *io);
void mloop_engine_complete_blocking (struct mloop_engine *e,
                                     struct mloop_io *io, int result);
long mloop_engine_perform_event (struct mloop_engine *e, struct mloop_io *io);
/* Gives back what mloop_engine_prepare() took for IO (a bounce buffer)
 * when IO prepared for AIO could not be submitted; complete is not called.
 */
void mloop_engine_abandon (struct mloop_engine *e, struct mloop_io *io);
enum mloop_event_result mloop_engine_complete_event (struct mloop_engine *e,
                                                     struct mloop_io *io,
                                                     long res);

#endif /* MLOOP_ENGINE_H */
