/* mloop — the file store: an image file or block device through kernel
 * AIO.  See file_store.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "aio_ring.h"
#include "align.h"
#include "engine.h"
#include "file_store.h"
#include "fileio.h"
#include "unaligned.h"

static int
file_reprobe_size (struct mloop_store *store, char *err, size_t errlen)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  if (e->overlay) {
    snprintf (err, errlen, "the size of a device with an overlay is fixed "
              "by the overlay");
    return -ENOTSUP;
  }
  return mloop_backing_reprobe_size (&e->backing, err, errlen);
}

static int
file_set_size (struct mloop_store *store, uint64_t size, char *err,
               size_t errlen)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  const struct mloop_backing *b = &e->backing;
  const char *why = NULL;

  if (e->overlay)
    why = "the size of a device with an overlay is fixed by the overlay";
  else if (b->is_block_device)
    why = "it is a block device: resize that device instead";
  else if (b->offset || b->sizelimit)
    why = "it is served through a window (--offset/--sizelimit)";
  if (why) {
    snprintf (err, errlen, "%s: cannot set its size: %s", b->path, why);
    return -ENOTSUP;
  }
  if (ftruncate (b->buffered_fd, (off_t) size) == -1) {
    int r = -errno;

    snprintf (err, errlen, "%s: setting its size to %" PRIu64 " bytes: %s",
              b->path, size, strerror (-r));
    return r;
  }
  return mloop_backing_reprobe_size (&e->backing, err, errlen);
}

/* The descriptor writes go to. */
static int
write_fd (const struct mloop_file_store *e)
{
  return e->overlay ? e->overlay->fd : e->backing.fd;
}

static int
file_flush (struct mloop_store *store)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  int told;

  if (e->overlay)
    return mloop_overlay_commit (e->overlay);
  told = __atomic_exchange_n (&e->probe_sync_error, 0, __ATOMIC_ACQ_REL);
  if (fdatasync (e->backing.fd) == -1)
    return -errno;
  return told;
}

/* Submits one probe iocb on RING and returns its result; *TAKEN says
 * whether the kernel took it (else the command is not there).
 */
static long
probe_iocb (struct mloop_aio_ring *ring, struct iocb *iocb, bool *taken)
{
  struct io_event ev;
  int r;

  *taken = false;
  r = mloop_aio_ring_submit (ring, &iocb, 1);
  if (r != 1)
    return r < 0 ? r : -EIO;
  r = mloop_aio_ring_reap (ring, 1, &ev, 1, NULL);
  *taken = r == 1;
  return r == 1 ? (long) ev.res : -EIO;
}

/* What the probes found, per filesystem (or for block devices, which
 * all flush alike), for the life of the process: the answers depend on
 * the kernel and the filesystem only, and a process that opens many
 * images (mloopd) would otherwise pay a scratch context's io_destroy,
 * an RCU grace period (tens of ms under emulation), for each.
 */
#define PROBED_MAX 64

static struct probed {
  dev_t dev;
  mode_t type;
  bool fua_known, fua_in_aio, flush_in_aio;
} probed[PROBED_MAX];
static unsigned probed_count;
static pthread_mutex_t probed_lock = PTHREAD_MUTEX_INITIALIZER;

/* The entry for FD's filesystem, or NULL (not probed yet, or no room:
 * then probed each time).  Called with probed_lock held.
 */
static struct probed *
probed_find (int fd, bool add)
{
  struct stat st;

  if (fstat (fd, &st) == -1)
    return NULL;
  st.st_mode &= S_IFMT;
  if (st.st_mode == S_IFBLK)
    st.st_dev = 0;
  for (unsigned i = 0; i < probed_count; i++)
    if (probed[i].dev == st.st_dev && probed[i].type == st.st_mode)
      return &probed[i];
  if (!add || probed_count == PROBED_MAX)
    return NULL;
  probed[probed_count] = (struct probed) { .dev = st.st_dev,
                                           .type = st.st_mode };
  return &probed[probed_count++];
}

/* Asks the kernel whether it takes RWF_DSYNC on AIO writes and
 * IOCB_CMD_FDSYNC, with harmless requests on one scratch context: a
 * zero-length write on the descriptor FUA writes use and a flush of an
 * idle file.  Once per filesystem (probed).
 */
static void
file_probe_features (struct mloop_store *store)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  struct mloop_aio_ring ring;
  struct iocb iocb;
  struct iovec iov = { NULL, 0 };
  struct probed *p;
  bool ring_open, taken;
  long got;

  pthread_mutex_lock (&probed_lock);
  p = probed_find (write_fd (e), false);
  if (p && p->fua_known) {
    e->fua_in_aio = p->fua_in_aio;
    e->flush_in_aio = p->flush_in_aio;
  }
  pthread_mutex_unlock (&probed_lock);
  if (p && p->fua_known)
    return;
  /* Not under the lock: a stalled disk's flush would hold up every
   * other image's open.
   */
  ring_open = mloop_aio_ring_init (&ring, 1) == 0;
  if (e->backing.writable) {
    io_prep_pwritev2 (&iocb, write_fd (e), &iov, 0, 0, RWF_DSYNC);
    e->fua_in_aio = ring_open && probe_iocb (&ring, &iocb, &taken) >= 0;
  }
  if (!ring_open)
    return;
  io_prep_fdsync (&iocb, write_fd (e));
  got = probe_iocb (&ring, &iocb, &taken);
  /* A sync that ran and failed is there, and told this descriptor of a
   * failed writeback no sync of it will report again: the first FLUSH
   * does.  (An overlay's FLUSH syncs a descriptor of its own.)
   */
  e->flush_in_aio = got >= 0 || (taken && got != -EINVAL);
  if (taken && got < 0 && got != -EINVAL && !e->overlay)
    e->probe_sync_error = (int) got;
  mloop_aio_ring_destroy (&ring);
  /* Remembered once both were asked. */
  if (e->backing.writable) {
    pthread_mutex_lock (&probed_lock);
    p = probed_find (write_fd (e), true);
    if (p) {
      p->fua_known = true;
      p->fua_in_aio = e->fua_in_aio;
      p->flush_in_aio = e->flush_in_aio;
    }
    pthread_mutex_unlock (&probed_lock);
  }
}

static void
file_close (struct mloop_store *store)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  mloop_range_lock_destroy (&e->rmw_lock);
  if (e->overlay) {
    mloop_overlay_close (e->overlay);
    free (e->overlay);
  }
  mloop_backing_close (&e->backing);
  free (e);
}

/* Points the iocb at what remains of the transfer after io->done bytes. */
static void
prep_remaining (struct mloop_file_store *e, struct mloop_io *io)
{
  char *data = (char *) (io->bounce ? io->bounce : io->buf) + io->done;
  size_t left = io->count - io->done;
  long long offset = (long long) (io->file_base + io->offset + io->done);
  int rw_flags = 0;

  io->iov.iov_base = data;
  io->iov.iov_len = left;
  if (io->op == MLOOP_IO_READ)
    io_prep_preadv2 (&io->iocb, io->fd, &io->iov, 1, offset, 0);
  else {
    if ((io->flags & MLOOP_IO_FUA) && e->fua_in_aio)
      rw_flags = RWF_DSYNC;
    io_prep_pwritev2 (&io->iocb, io->fd, &io->iov, 1, offset, rw_flags);
  }
  io->iocb.data = io;
}

static void
release_bounce (struct mloop_io *io)
{
  if (io->bounce_allocated)
    mloop_free_aligned (io->bounce, io->count);
  io->bounce = NULL;
  io->bounce_allocated = false;
}

static void
finish (struct mloop_io *io, int error)
{
  if (io->bounce && error == 0 && io->op == MLOOP_IO_READ)
    memcpy (io->buf, io->bounce, io->count);
  release_bounce (io);
  io->complete (io, error);
}

/* With an overlay: whole clusters all in the overlay, or (reads) all in
 * the base before its page-cache tail, go by AIO to the one file that
 * holds them (a FUA write with RWF_DSYNC: its sync's reports are the
 * overlay's still, overlay.h, sync_fd).  Everything else, and every write that would
 * change the map (a cluster's first), is done synchronously by the
 * overlay.
 */
static int
route_through_overlay (struct mloop_file_store *e, struct mloop_io *io)
{
  struct mloop_overlay *ov = e->overlay;
  const bool whole = mloop_is_aligned (io->offset, MLOOP_OVERLAY_CLUSTER) &&
                     mloop_is_aligned (io->count, MLOOP_OVERLAY_CLUSTER);
  const enum mloop_overlay_where where =
    mloop_overlay_where (ov, io->offset, io->count);

  if (!whole)
    return MLOOP_PREPARED_BLOCKING;
  if (io->op == MLOOP_IO_WRITE) {
    /* A write that changes the map syncs its data first (overlay.h,
     * mloop_overlay_mark): a helper's work, not the loop's.  So is a FUA
     * write while a map word is not yet durable (or a sync failed): its
     * data is reachable only through its clusters' words, so the
     * overlay commits the whole file after it.
     */
    if (where != MLOOP_OVERLAY_IN_OVERLAY ||
        ((io->flags & MLOOP_IO_FUA) && !mloop_overlay_map_durable (ov)))
      return MLOOP_PREPARED_BLOCKING;
  }
  else if (where == MLOOP_OVERLAY_MIXED ||
           (where == MLOOP_OVERLAY_IN_BASE &&
            io->offset + io->count >
            mloop_backing_buffered_from (&e->backing)))
    return MLOOP_PREPARED_BLOCKING;
  else if (where == MLOOP_OVERLAY_IN_BASE)
    return MLOOP_PREPARED_AIO;
  io->fd = ov->fd;
  io->file_base = ov->data_offset;
  return MLOOP_PREPARED_AIO;
}

/* Checks a read or write and decides how it reaches the disk:
 *   aligned offset, length and buffer  → AIO on the O_DIRECT descriptor,
 *                                        zero copy;
 *   aligned offset and length only     → AIO through an aligned bounce
 *                                        buffer (one copy);
 *   unaligned offset or length         → read-modify-write, synchronously
 *                                        (unaligned.c);
 *   any byte in the page-cache tail    → the buffered descriptor for
 *                                        those bytes, synchronously.
 * Returns MLOOP_PREPARED_AIO when the iocb is ready to submit,
 * MLOOP_PREPARED_BLOCKING for the synchronous paths, or a negative errno.
 */
static int
prepare_rw (struct mloop_file_store *e, struct mloop_io *io)
{
  const struct mloop_backing *b = &e->backing;
  uint32_t lbs = b->logical_block_size;
  bool is_write = io->op == MLOOP_IO_WRITE;
  const uint64_t size = mloop_backing_size (b);

  if (io->count > MLOOP_MAX_REQUEST)
    return -EINVAL;
  if (io->offset > size || io->count > size - io->offset)
    return is_write ? -ENOSPC : -EINVAL;
  if (is_write && !b->writable)
    return -EPERM;

  io->fd = b->fd;
  io->file_base = b->offset;
  io->bounce = NULL;
  io->bounce_allocated = false;
  io->done = 0;
  if (e->overlay) {
    int r = route_through_overlay (e, io);

    if (r != MLOOP_PREPARED_AIO)
      return r;
  }
  else if (io->offset + io->count > mloop_backing_buffered_from (b))
    /* Reaches the page-cache tail of an odd-sized file. */
    return MLOOP_PREPARED_BLOCKING;
  if (b->direct && !mloop_io_is_direct_safe (io->buf, io->count, io->offset,
                                             lbs)) {
    if (mloop_is_aligned (io->offset, lbs) &&
        mloop_is_aligned (io->count, lbs)) {
      if (io->scratch && io->scratch_size >= io->count &&
          mloop_is_aligned ((uintptr_t) io->scratch, lbs))
        io->bounce = io->scratch;
      else {
        io->bounce = mloop_alloc_aligned (io->count, lbs);
        if (io->bounce == NULL)
          return -ENOMEM;
        io->bounce_allocated = true;
      }
      if (is_write)
        memcpy (io->bounce, io->buf, io->count);
    }
    else
      return MLOOP_PREPARED_BLOCKING;
  }
  prep_remaining (e, io);
  return MLOOP_PREPARED_AIO;
}

static enum mloop_event_result
file_complete_event (struct mloop_store *store, struct mloop_io *io,
                     long res)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;
  int error = 0;

  if (res < 0) {
    error = (int) -res;
    if (e->overlay && io->op == MLOOP_IO_WRITE)
      mloop_overlay_write_failed (e->overlay, (int) res,
                                  (io->flags & MLOOP_IO_FUA) && e->fua_in_aio);
  }
  else if (io->op != MLOOP_IO_FLUSH) {
    io->done += (size_t) res;
    if (io->done < io->count) {
      if (res == 0 ||
          !mloop_is_aligned (io->done, mloop_backing_alignment (&e->backing)))
        /* End of file before the end of the request (O_DIRECT stops short
         * only there): the backing file shrank under us.
         */
        error = EIO;
      else {
        prep_remaining (e, io);
        return MLOOP_EVENT_RESUBMIT;
      }
    }
    else if (io->op == MLOOP_IO_WRITE && (io->flags & MLOOP_IO_FUA) &&
             !e->fua_in_aio) {
      /* Old kernel: FUA as write then fdatasync, on this thread. */
      if (e->overlay)
        error = -mloop_overlay_commit (e->overlay);
      else if (fdatasync (io->fd) == -1)
        error = errno;
    }
    if (error == 0 && io->op == MLOOP_IO_WRITE && e->overlay)
      error = -mloop_overlay_mark (e->overlay, io->offset, io->count);
  }
  finish (io, error);
  return MLOOP_EVENT_DONE;
}

static int
file_prepare (struct mloop_store *store, struct mloop_io *io)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  switch (io->op) {
  case MLOOP_IO_READ:
  case MLOOP_IO_WRITE:
    if (io->count == 0) {
      if (io->op == MLOOP_IO_WRITE && !e->backing.writable)
        return -EPERM;
      io->bounce = NULL;
      io->bounce_allocated = false;
      finish (io, 0);
      return MLOOP_PREPARED_DONE;
    }
    return prepare_rw (e, io);
  case MLOOP_IO_FLUSH:
    io->bounce = NULL;
    io->bounce_allocated = false;
    io->fd = write_fd (e);
    /* An overlay's flush also writes its map: no AIO form.  Nor a
     * flush that has the probe's failure to report (file_flush).
     */
    if (!e->flush_in_aio || e->overlay ||
        __atomic_load_n (&e->probe_sync_error, __ATOMIC_ACQUIRE))
      return MLOOP_PREPARED_BLOCKING;
    io_prep_fdsync (&io->iocb, io->fd);
    io->iocb.data = io;
    return MLOOP_PREPARED_AIO;
  default:
    return -EINVAL;
  }
}

static int
file_perform_blocking (struct mloop_store *store, struct mloop_io *io)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  if (io->op == MLOOP_IO_FLUSH)
    return file_flush (store);
  if (e->overlay)
    return mloop_overlay_rw (e->overlay, &e->backing, &e->rmw_lock,
                             io->op == MLOOP_IO_WRITE, io->buf, io->count,
                             io->offset, io->flags & MLOOP_IO_FUA);
  return mloop_sync_rw (e, io);
}

static long
file_perform_event (struct mloop_store *store, struct mloop_io *io)
{
  struct mloop_file_store *e = (struct mloop_file_store *) store;

  /* prep_remaining() left io->iov and the offset of what remains. */
  off_t offset = (off_t) (io->file_base + io->offset + io->done);
  int rw_flags = 0;
  ssize_t n;

  if (io->op == MLOOP_IO_FLUSH)
    return fdatasync (io->fd) == -1 ? -errno : 0;
  if (io->op == MLOOP_IO_WRITE && (io->flags & MLOOP_IO_FUA) &&
      e->fua_in_aio)
    rw_flags = RWF_DSYNC;
  do
    n = io->op == MLOOP_IO_READ
      ? preadv2 (io->fd, &io->iov, 1, offset, 0)
      : pwritev2 (io->fd, &io->iov, 1, offset, rw_flags);
  while (n == -1 && errno == EINTR);
  return n == -1 ? -errno : (long) n;
}

static void
file_complete_blocking (struct mloop_store *store, struct mloop_io *io,
                        int result)
{
  (void) store;
  finish (io, -result);
}

static void
file_abandon (struct mloop_store *store, struct mloop_io *io)
{
  (void) store;
  release_bounce (io);
}

static uint64_t
file_size (const struct mloop_store *store)
{
  const struct mloop_file_store *e = (const struct mloop_file_store *) store;

  return mloop_backing_size (&e->backing);
}

static void
file_describe (const struct mloop_store *store, char *buf, size_t len)
{
  const struct mloop_file_store *e = (const struct mloop_file_store *) store;
  const struct mloop_backing *b = &e->backing;

  snprintf (buf, len, "%s: %" PRIu64 " bytes at offset %" PRIu64
            ", block size %" PRIu32 ", %s, %s%s",
            b->path, mloop_backing_size (b), b->offset,
            b->logical_block_size, b->direct ? "O_DIRECT" : "buffered",
            e->base.info.writable ? "read-write" : "read-only",
            e->overlay ? ", with an overlay" : "");
}

static const struct mloop_store_ops file_ops = {
  .kind = "file",
  .probe_features = file_probe_features,
  .close = file_close,
  .prepare = file_prepare,
  .perform_blocking = file_perform_blocking,
  .complete_blocking = file_complete_blocking,
  .perform_event = file_perform_event,
  .abandon = file_abandon,
  .complete_event = file_complete_event,
  .flush = file_flush,
  .trim = mloop_file_store_trim,
  .zero = mloop_file_store_zero,
  .extents = mloop_file_store_extents,
  .reprobe_size = file_reprobe_size,
  .set_size = file_set_size,
  .size = file_size,
  .describe = file_describe,
};

/* What front ends read of a file store (store.h). */
static void
describe_info (struct mloop_file_store *e)
{
  struct mloop_store_info *info = &e->base.info;
  const struct mloop_backing *b = &e->backing;

  info->writable = b->writable;
  info->preferred_block_size = mloop_backing_preferred_block_size (b);
  info->buffer_alignment = mloop_backing_alignment (b);
  info->direct = b->direct;
  info->direct_fell_back = b->direct_fallback;
  info->can_extents = !b->is_block_device;
  info->is_block_device = b->is_block_device;
}

int
mloop_file_store_open (struct mloop_store **out,
                       const struct mloop_engine_config *cfg,
                       char *err, size_t errlen)
{
  struct mloop_file_store *e = calloc (1, sizeof *e);
  int r;

  if (e == NULL) {
    snprintf (err, errlen, "no memory for the store");
    return -ENOMEM;
  }
  e->base.ops = &file_ops;
  /* With an overlay the base is only read, and may be shared. */
  r = mloop_backing_open (&e->backing, cfg->path, cfg->direct,
                          cfg->want_write && cfg->overlay == NULL,
                          &cfg->window, err, errlen);
  if (r < 0) {
    free (e);
    return r;
  }
  /* Held shared for the life of the store, on the descriptor the store
   * keeps (inherited by nbdkit's daemonizing fork): `mloop overlay
   * commit` takes it exclusively to merge into this file, which no
   * server may read or write meanwhile, whatever name it was given.
   * Shared, so that readers, overlays and side-by-side windows of one
   * image coexist; an open file description lock, not flock(), so that
   * a user who may only read the image cannot hold it exclusively and
   * keep every server off it (fileio.h).
   */
  if ((r = mloop_lock_image (e->backing.fd, false)) < 0) {
    snprintf (err, errlen, "%s is locked by an overlay being merged into "
              "it (mloop overlay commit): %s", cfg->path, strerror (-r));
    mloop_backing_close (&e->backing);
    free (e);
    return r;
  }
  if (cfg->overlay) {
    enum mloop_overlay_base_check check = cfg->overlay_adopt_base
      ? MLOOP_OVERLAY_ADOPT_BASE : MLOOP_OVERLAY_SAME_BASE;

    e->overlay = malloc (sizeof *e->overlay);
    if (e->overlay == NULL)
      r = -ENOMEM;
    else if (cfg->overlay_must_exist)
      r = mloop_overlay_open_existing (e->overlay, cfg->overlay, NULL,
                                       &e->backing, e->backing.direct, check,
                                       err, errlen);
    else
      r = mloop_overlay_open (e->overlay, cfg->overlay, &e->backing,
                              e->backing.direct, check, err, errlen);
    if (r < 0) {
      if (r == -ENOMEM && e->overlay == NULL)
        snprintf (err, errlen, "no memory for an overlay");
      /* Renamed or removed under a device in use: made empty, it would
       * serve the base's bytes where the device's writes were.
       */
      if (r == -ENOENT && cfg->overlay_must_exist)
        snprintf (err, errlen, "the overlay %s is gone: not making an "
                  "empty one under a device in use", cfg->overlay);
      free (e->overlay);
      mloop_backing_close (&e->backing);
      free (e);
      return r;
    }
    e->backing.writable = cfg->want_write;
    if (e->backing.logical_block_size < MLOOP_OVERLAY_CLUSTER)
      e->backing.logical_block_size = MLOOP_OVERLAY_CLUSTER;
  }
  mloop_range_lock_init (&e->rmw_lock);
  describe_info (e);
  *out = &e->base;
  return 0;
}
