/* mloop — the RBD store: a Ceph RBD image through librbd's asynchronous
 * API (store.h's second kind), built as the module rbd_load.h loads.
 *
 * Names: "rbd:[POOL/]IMAGE[@SNAP][:id=NAME][:conf=FILE][:shared=on]",
 * as qemu spells them (POOL defaults to "rbd"; the options stand in for
 * the configuration's ceph_id, ceph_conf and shared).  A snapshot is
 * served read-only.
 *
 * The request path: reads, writes and flushes go to rbd_aio_*; librbd
 * completes them on its own threads, where the completion callback posts
 * the request to io->port (port.h), so an event loop gets it through the
 * eventfd it already polls.  A front end that names no port gets the
 * synchronous calls on a thread that may block instead.
 *
 * Durability: librbd's cache is turned off (rbd_cache=false), as a file
 * is served with O_DIRECT: a write librbd completes is then on the OSDs
 * (an OSD acknowledges a write once it is committed on every replica),
 * so FUA needs nothing more, and FLUSH is rbd_aio_flush, which the
 * cache-less image completes at once.
 *
 * Exclusive use: a writable image is served under librbd's exclusive
 * lock, acquired explicitly (rbd_lock_acquire), which librbd then never
 * hands to another client that asks for it; a second writer is refused
 * at open with the holder named, unless both chose to share
 * (mloop_engine_config.shared).  Read-only opens take no lock.
 *
 * A cluster gone: librados waits for it, and so does every request,
 * unless the configuration sets io_timeout (--io-timeout): then a
 * request the cluster has not answered in that time fails with EIO,
 * and the same open image serves again once it answers ("timeouts").
 *
 * Trim is rbd_discard, partial objects included, so the range then reads
 * as zeroes, as a trimmed file does; zero is
 * rbd_write_zeroes, which frees whole objects and zeroes the rest
 * sparsely on the OSD, so a fast zero is refused only when the range
 * must stay allocated (thick provisioning writes every byte).  Extents
 * come from the image's allocation (rbd_diff_iterate2 from the start of
 * time, parent included).  Resizes made elsewhere (`rbd resize`) reach
 * the store's size through librbd's update watch.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <rados/librados.h>
#include <rbd/librbd.h>

#include "engine.h"
#include "rbd_load.h"
#include "store.h"

#define DEFAULT_POOL "rbd"

/* How long librados waits for the monitors at start-up before saying
 * so, unless the configuration sets client_mount_timeout (its default,
 * 300 s, would leave an attach hanging for five minutes on a typo).
 */
#define MOUNT_TIMEOUT "30"

/* The logical block size advertised, as rbd-nbd and krbd do: librbd
 * takes any byte range, so this only guides clients.
 */
#define RBD_BLOCK_SIZE 512

struct rbd_store {
  struct mloop_store base;
  char *name;                   /* "rbd:POOL/IMAGE[@SNAP]", for messages */
  char *pool, *image, *snap;    /* snap: NULL for the image itself */
  char *id, *conf;              /* NULL: librados's defaults */
  bool shared;                  /* no exclusive lock */
  rados_t cluster;
  rados_ioctx_t ioctx;
  rbd_image_t rbd;
  uint64_t size;                /* atomic: the update watch changes it */
  bool locked;                  /* we hold the exclusive lock */
  bool watching;
  uint64_t watch_handle;
  unsigned in_flight;           /* atomic: taken, not yet posted */
  /* Requests the cluster did not answer in time (see "timeouts"):
   * io_timeout in seconds, --io-timeout's, else the configuration's
   * rados_osd_op_timeout; 0: none.
   */
  unsigned io_timeout;
  void (*notice) (const char *line);
  bool silent;                  /* atomic: said so, not yet that it answers */
  pthread_mutex_t silence_lock; /* the rest, and the notices' order */
  uint64_t last_timeout_ms;     /* monotonic */
  unsigned timed_out;           /* requests failed since it was said */
  bool blocklisted;             /* atomic: said that the cluster refuses us */
};

static struct rbd_store *
store_of (const struct mloop_store *s)
{
  return (struct rbd_store *) s;
}

/* ------------------------------------------------------------ requests */

static uint64_t
store_size (const struct mloop_store *s)
{
  return __atomic_load_n (&store_of (s)->size, __ATOMIC_ACQUIRE);
}

/* The range and permission checks every request passes, with the file
 * store's errors: out of range is EINVAL for reads, ENOSPC for writes.
 */
static int
check_request (const struct rbd_store *st, bool is_write, uint64_t offset,
               uint64_t count)
{
  const uint64_t size = store_size (&st->base);

  if (offset > size || count > size - offset)
    return is_write ? -ENOSPC : -EINVAL;
  if (is_write && !st->base.info.writable)
    return -EPERM;
  return 0;
}

/* ------------------------------------------------------------ timeouts */

/* With io_timeout set, librados fails a request the cluster has not
 * answered in that time with -ETIMEDOUT (rados_osd_op_timeout,
 * rados_mon_op_timeout), and the same open image serves again once the
 * cluster answers.  NBD has no ETIMEDOUT, and a block device's user
 * knows only EIO: the request fails with EIO, and a notice says why.
 *
 * One notice when a request first times out, one when the cluster
 * answers again: when a request succeeds and none has timed out for
 * io_timeout seconds.  A cluster that answers some requests and not
 * others (one OSD of many gone) is not answering again, and two lines
 * at every other request would flood the log.
 */
static void
say (struct rbd_store *st, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

static void
say (struct rbd_store *st, const char *fmt, ...)
{
  char line[512];
  va_list ap;

  if (st->notice == NULL)
    return;
  va_start (ap, fmt);
  vsnprintf (line, sizeof line, fmt, ap);
  va_end (ap);
  st->notice (line);
}

static uint64_t
monotonic_ms (void)
{
  struct timespec now;

  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000 + (uint64_t) now.tv_nsec / 1000000;
}

static void
note_timeout (struct rbd_store *st)
{
  pthread_mutex_lock (&st->silence_lock);
  st->last_timeout_ms = monotonic_ms ();
  st->timed_out++;
  if (!__atomic_load_n (&st->silent, __ATOMIC_RELAXED)) {
    __atomic_store_n (&st->silent, true, __ATOMIC_RELAXED);
    say (st, "%s: the cluster did not answer in %u s: requests fail with "
         "EIO until it does", st->name, st->io_timeout);
  }
  pthread_mutex_unlock (&st->silence_lock);
}

static void
note_answer (struct rbd_store *st)
{
  pthread_mutex_lock (&st->silence_lock);
  if (__atomic_load_n (&st->silent, __ATOMIC_RELAXED) &&
      monotonic_ms () - st->last_timeout_ms >= st->io_timeout * 1000ull) {
    __atomic_store_n (&st->silent, false, __ATOMIC_RELAXED);
    say (st, "%s: the cluster answers again (%u request%s failed with EIO "
         "meanwhile)", st->name, st->timed_out, st->timed_out == 1 ? "" : "s");
    st->timed_out = 0;
  }
  pthread_mutex_unlock (&st->silence_lock);
}

/* R: what librbd answered a request (a negative errno, or not).
 * Returns it, with a timeout made EIO.
 */
static long
answered (struct rbd_store *st, long r)
{
  if (r == -ETIMEDOUT) {
    note_timeout (st);
    return -EIO;
  }
  /* librbd's EBLOCKLISTED: another client broke our lock and had the
   * cluster refuse us.  Not NBD's ESHUTDOWN (which says the server is
   * going away): every request fails from now on, an IO error.
   */
  if (r == -ESHUTDOWN) {
    if (!__atomic_exchange_n (&st->blocklisted, true, __ATOMIC_RELAXED))
      say (st, "%s: another client broke this server's exclusive lock and "
           "the cluster refuses it (blocklisted): requests fail with EIO",
           st->name);
    return -EIO;
  }
  if (__atomic_load_n (&st->silent, __ATOMIC_RELAXED))
    note_answer (st);
  return r;
}

/* On a librbd thread.  In flight until posted: quiesce waits for that. */
static void
on_rbd_complete (rbd_completion_t c, void *arg)
{
  struct mloop_io *io = arg;
  struct rbd_store *st = store_of (io->taken_by);
  long res = (long) rbd_aio_get_return_value (c);

  rbd_aio_release (c);
  io->port->post (io->port, io, res);
  __atomic_sub_fetch (&st->in_flight, 1, __ATOMIC_RELEASE);
}

static int
store_prepare (struct mloop_store *s, struct mloop_io *io)
{
  struct rbd_store *st = store_of (s);
  rbd_completion_t c;
  int r;

  if (io->op != MLOOP_IO_FLUSH) {
    if (io->count > MLOOP_MAX_REQUEST)
      return -EINVAL;
    r = check_request (st, io->op == MLOOP_IO_WRITE, io->offset, io->count);
    if (r < 0)
      return r;
    if (io->count == 0) {
      io->complete (io, 0);
      return MLOOP_PREPARED_DONE;
    }
  }
  if (io->port == NULL)
    return MLOOP_PREPARED_BLOCKING;
  r = rbd_aio_create_completion (io, on_rbd_complete, &c);
  if (r < 0)
    return r;
  io->taken_by = s;
  __atomic_add_fetch (&st->in_flight, 1, __ATOMIC_RELAXED);
  switch (io->op) {
  case MLOOP_IO_READ:
    r = rbd_aio_read (st->rbd, io->offset, io->count, io->buf, c);
    break;
  case MLOOP_IO_WRITE:
    r = rbd_aio_write (st->rbd, io->offset, io->count, io->buf, c);
    break;
  case MLOOP_IO_FLUSH:
    r = rbd_aio_flush (st->rbd, c);
    break;
  default:
    r = -EINVAL;
  }
  if (r < 0) {
    rbd_aio_release (c);
    __atomic_sub_fetch (&st->in_flight, 1, __ATOMIC_RELAXED);
    return r;
  }
  return MLOOP_PREPARED_QUEUED;
}

/* RES: librbd's return value: a negative errno, or for a read the
 * bytes read (0 for an asynchronous write, the bytes for rbd_write).
 */
static int
result_error (const struct mloop_io *io, long res)
{
  if (res < 0)
    return (int) -res;
  if (io->op == MLOOP_IO_READ && (size_t) res != io->count)
    return EIO;                 /* the image shrank under the request */
  return 0;
}

static enum mloop_event_result
store_complete_event (struct mloop_store *s, struct mloop_io *io, long res)
{
  io->complete (io, result_error (io, answered (store_of (s), res)));
  return MLOOP_EVENT_DONE;
}

static int
store_perform_blocking (struct mloop_store *s, struct mloop_io *io)
{
  struct rbd_store *st = store_of (s);
  ssize_t n;

  switch (io->op) {
  case MLOOP_IO_READ:
    n = rbd_read (st->rbd, io->offset, io->count, io->buf);
    break;
  case MLOOP_IO_WRITE:
    n = rbd_write (st->rbd, io->offset, io->count, io->buf);
    break;
  case MLOOP_IO_FLUSH:
    return (int) answered (st, rbd_flush (st->rbd));
  default:
    return -EINVAL;
  }
  return -result_error (io, answered (st, (long) n));
}

static void
store_complete_blocking (struct mloop_store *s, struct mloop_io *io,
                       int result)
{
  io->complete (io, -result);
}

/* Never prepared for AIO: nothing to perform or give back. */
static long
store_perform_event (struct mloop_store *s, struct mloop_io *io)
{
  return -EINVAL;
}

static void
store_abandon (struct mloop_store *s, struct mloop_io *io)
{
}

static int
store_flush_now (struct mloop_store *s)
{
  return (int) answered (store_of (s), rbd_flush (store_of (s)->rbd));
}

/* ------------------------------------------------------------ space */

/* The most one librbd call of the space operations is given: what fits
 * the int or ssize_t each answers in.
 */
#define RBD_STEP ((size_t) 1 << 30)

static int
store_trim (struct mloop_store *s, uint64_t offset, uint64_t count,
            unsigned flags)
{
  struct rbd_store *st = store_of (s);
  int r = check_request (st, true, offset, count);

  if (r == -ENOSPC)
    return -EINVAL;             /* a trim past the end, as for files */
  /* rbd_discard refuses more than INT_MAX bytes at once (it answers in
   * an int); an NBD trim may be up to 4 GiB - 1.
   */
  while (r == 0 && count > 0) {
    size_t step = count > RBD_STEP ? RBD_STEP : (size_t) count;
    /* The bytes discarded, or a negative errno. */
    ssize_t n = answered (st, rbd_discard (st->rbd, offset, step));

    r = n < 0 ? (int) n : 0;
    offset += step;
    count -= step;
  }
  return r;
}

static int
store_zero (struct mloop_store *s, uint64_t offset, uint64_t count,
            unsigned flags)
{
  struct rbd_store *st = store_of (s);
  int zero_flags = 0;
  ssize_t n;
  int r = check_request (st, true, offset, count);

  if (r < 0 || count == 0)
    return r;
  if (flags & MLOOP_ZERO_NO_HOLE) {
    if (flags & MLOOP_ZERO_FAST)
      return -ENOTSUP;          /* thick provisioning writes every byte */
    zero_flags = RBD_WRITE_ZEROES_FLAG_THICK_PROVISION;
  }
  /* rbd_write_zeroes takes a size_t and answers in an ssize_t: in steps
   * that fit both, whatever the platform.
   */
  while (count > 0) {
    size_t step = count > RBD_STEP ? RBD_STEP : (size_t) count;

    n = answered (st, rbd_write_zeroes (st->rbd, offset, step, zero_flags,
                                        0));
    if (n < 0)
      return (int) n;
    offset += step;
    count -= step;
  }
  return 0;
}

/* rbd_diff_iterate2 names only the allocated extents: the walk fills
 * the gaps with holes, so FN sees the whole range, in order.  librbd
 * does not stop for its callback (Pacific ignores what it returns until
 * the range is walked), so a walk that is done ignores what follows.
 */
struct extent_walk {
  uint64_t pos, end;
  bool req_one;
  mloop_extent_fn fn;
  void *opaque;
  bool done;                    /* REQ_ONE's extent given, or FN failed */
  int error;                    /* FN's, which stopped the walk */
};

#define WALK_DONE 1             /* asks rbd_diff_iterate2 to stop */

static int
walk_emit (struct extent_walk *w, uint64_t to, bool hole)
{
  int r;

  if (w->done)
    return WALK_DONE;
  if (to > w->end)
    to = w->end;
  if (to <= w->pos)
    return 0;
  r = w->fn (w->opaque, w->pos, to - w->pos, hole);
  w->pos = to;
  if (r < 0) {
    w->error = r;
    w->done = true;
    return -1;
  }
  w->done = w->req_one;
  return w->done ? WALK_DONE : 0;
}

static int
on_diff_extent (uint64_t offset, size_t length, int exists, void *arg)
{
  struct extent_walk *w = arg;
  int r = walk_emit (w, offset, true);

  if (r != 0)
    return r;
  return walk_emit (w, offset + length, !exists);
}

static int
store_extents (struct mloop_store *s, uint64_t offset, uint64_t count,
             bool req_one, mloop_extent_fn fn, void *opaque)
{
  struct rbd_store *st = store_of (s);
  struct extent_walk w = {
    .pos = offset, .end = offset + count, .req_one = req_one,
    .fn = fn, .opaque = opaque,
  };
  int r;

  if (offset > store_size (s) || count > store_size (s) - offset)
    return -EINVAL;
  r = (int) answered (st, rbd_diff_iterate2 (st->rbd, NULL, offset, count, 1,
                                             0, on_diff_extent, &w));
  if (w.error)
    return w.error;
  if (w.done)
    return 0;
  if (r < 0)
    return r;
  walk_emit (&w, w.end, true);
  return w.error;
}

/* ------------------------------------------------------------ size */

static int
read_size (struct rbd_store *st)
{
  uint64_t size;
  int r = rbd_get_size (st->rbd, &size);

  if (r == 0)
    __atomic_store_n (&st->size, size, __ATOMIC_RELEASE);
  return r;
}

static int
store_reprobe_size (struct mloop_store *s, char *err, size_t errlen)
{
  struct rbd_store *st = store_of (s);
  int r = read_size (st);

  if (r < 0)
    snprintf (err, errlen, "%s: reading the size: %s", st->name,
              strerror (-r));
  return r;
}

/* Resizes the image.  When another client (the device's server) holds
 * the exclusive lock, librbd hands the resize to that holder, which
 * performs it and so serves the new size at once.
 */
static int
store_set_size (struct mloop_store *s, uint64_t size, char *err,
                size_t errlen)
{
  struct rbd_store *st = store_of (s);
  int r;

  if (!s->info.writable) {
    snprintf (err, errlen, "%s: cannot set its size: %s", st->name,
              st->snap ? "a snapshot is read-only" : "opened read-only");
    return -EROFS;
  }
  r = rbd_resize (st->rbd, size);
  if (r == 0)
    r = read_size (st);
  if (r < 0)
    snprintf (err, errlen, "%s: resizing to %" PRIu64 " bytes: %s",
              st->name, size, strerror (-r));
  return r;
}

/* librbd's update watch: the image's header changed (a resize, a
 * snapshot, a feature), here or elsewhere.  Requests checked after this
 * see the new size.
 */
static void
on_image_update (void *arg)
{
  read_size (arg);
}

/* ------------------------------------------------------------ open */

static void
store_describe (const struct mloop_store *s, char *buf, size_t len)
{
  const struct rbd_store *st = store_of (s);

  snprintf (buf, len, "%s: %" PRIu64 " bytes, %s%s", st->name, store_size (s),
            s->info.writable ? "read-write" : "read-only",
            st->locked ? ", exclusive lock held"
            : s->info.writable ? ", shared" : "");
}

static void
store_probe_features (struct mloop_store *s)
{
}

/* Polls: only a front end stopping with requests in flight waits here,
 * once, and librbd gives no way to wait for them all but rbd_close.
 */
static void
store_quiesce (struct mloop_store *s)
{
  const struct timespec tick = { 0, 1000000 };

  while (__atomic_load_n (&store_of (s)->in_flight, __ATOMIC_ACQUIRE))
    nanosleep (&tick, NULL);
}

static void
store_close (struct mloop_store *s)
{
  struct rbd_store *st = store_of (s);

  if (st->rbd) {
    if (st->watching)
      rbd_update_unwatch (st->rbd, st->watch_handle);
    if (st->locked)
      rbd_lock_release (st->rbd);
    rbd_close (st->rbd);
  }
  if (st->ioctx)
    rados_ioctx_destroy (st->ioctx);
  if (st->cluster)
    rados_shutdown (st->cluster);
  pthread_mutex_destroy (&st->silence_lock);
  free (st->name);
  free (st->pool);
  free (st->image);
  free (st->snap);
  free (st->id);
  free (st->conf);
  free (st);
}

static const struct mloop_store_ops rbd_ops = {
  .kind = "rbd",
  .probe_features = store_probe_features,
  .quiesce = store_quiesce,
  .close = store_close,
  .prepare = store_prepare,
  .perform_blocking = store_perform_blocking,
  .complete_blocking = store_complete_blocking,
  .perform_event = store_perform_event,
  .abandon = store_abandon,
  .complete_event = store_complete_event,
  .flush = store_flush_now,
  .trim = store_trim,
  .zero = store_zero,
  .extents = store_extents,
  .reprobe_size = store_reprobe_size,
  .set_size = store_set_size,
  .size = store_size,
  .describe = store_describe,
};

/* The options a name may carry after the image, as qemu spells them:
 * ":id=NAME", ":conf=FILE", ":shared=on|off".  They win over the
 * configuration's (mloop attach records the device's this way, so that
 * every server restarted for it connects the same).
 */
static int
parse_option (struct rbd_store *st, const char *opt, char *err,
              size_t errlen)
{
  const char *eq = strchr (opt, '=');
  const char *value = eq ? eq + 1 : "";
  const size_t key_len = eq ? (size_t) (eq - opt) : strlen (opt);
  char **to = NULL;

  if (key_len == 2 && strncmp (opt, "id", 2) == 0)
    to = &st->id;
  else if (key_len == 4 && strncmp (opt, "conf", 4) == 0)
    to = &st->conf;
  else if (key_len == 6 && strncmp (opt, "shared", 6) == 0) {
    if (strcmp (value, "on") != 0 && strcmp (value, "off") != 0) {
      snprintf (err, errlen, "%s: shared=%s: must be on or off", st->name,
                value);
      return -EINVAL;
    }
    st->shared = strcmp (value, "on") == 0;
    return 0;
  }
  if (to == NULL || *value == '\0') {
    snprintf (err, errlen, "%s: '%s': expected id=NAME, conf=FILE or "
              "shared=on|off after the image", st->name, opt);
    return -EINVAL;
  }
  free (*to);
  if ((*to = strdup (value)) == NULL)
    return -ENOMEM;
  return 0;
}

/* Splits "rbd:[POOL/]IMAGE[@SNAP][:OPTION...]" into ST's pool, image,
 * snap and options, over CFG's defaults.
 */
static int
parse_name (struct rbd_store *st, const struct mloop_engine_config *cfg,
            char *err, size_t errlen)
{
  char *spec = strdup (st->name + strlen (MLOOP_RBD_PREFIX));
  char *options, *slash, *at, *image;
  int r = 0;

  st->shared = cfg->shared;
  st->id = cfg->ceph_id ? strdup (cfg->ceph_id) : NULL;
  st->conf = cfg->ceph_conf ? strdup (cfg->ceph_conf) : NULL;
  if (spec == NULL || (cfg->ceph_id && st->id == NULL) ||
      (cfg->ceph_conf && st->conf == NULL)) {
    free (spec);
    snprintf (err, errlen, "no memory for %s", st->name);
    return -ENOMEM;
  }
  options = strchr (spec, ':');
  if (options)
    *options++ = '\0';
  slash = strchr (spec, '/');
  image = slash ? slash + 1 : spec;
  if (slash)
    *slash = '\0';
  at = strchr (image, '@');
  if (at)
    *at++ = '\0';
  st->pool = strdup (slash ? spec : DEFAULT_POOL);
  st->image = strdup (image);
  st->snap = at ? strdup (at) : NULL;
  if (st->pool == NULL || st->image == NULL || (at && st->snap == NULL))
    r = -ENOMEM;
  else if (st->pool[0] == '\0' || st->image[0] == '\0' ||
           strchr (image, '/') || (at && (*at == '\0' || strchr (at, '@')))) {
    snprintf (err, errlen, "%s: expected rbd:POOL/IMAGE or "
              "rbd:POOL/IMAGE@SNAPSHOT", st->name);
    r = -EINVAL;
  }
  while (r == 0 && options) {
    char *next = strchr (options, ':');

    if (next)
      *next++ = '\0';
    r = parse_option (st, options, err, errlen);
    options = next;
  }
  if (r == -ENOMEM)
    snprintf (err, errlen, "no memory for %s", st->name);
  free (spec);
  return r;
}

/* Connects to the cluster as CFG says: its configuration file (or
 * librados's own search), $CEPH_ARGS, the cephx user.
 */
static int
connect_cluster (struct rbd_store *st, char *err, size_t errlen)
{
  const char *who = st->id ? st->id : "admin";
  int r = rados_create (&st->cluster, st->id);

  if (r < 0) {
    st->cluster = NULL;
    snprintf (err, errlen, "%s: librados: %s", st->name, strerror (-r));
    return r;
  }
  rados_conf_set (st->cluster, "client_mount_timeout", MOUNT_TIMEOUT);
  r = rados_conf_read_file (st->cluster, st->conf);
  if (r < 0) {
    if (st->conf)
      snprintf (err, errlen, "%s: reading Ceph configuration %s: %s",
                st->name, st->conf, strerror (-r));
    else
      snprintf (err, errlen, "%s: no Ceph configuration found ($CEPH_CONF, "
                "/etc/ceph/ceph.conf; or say --ceph-conf)", st->name);
    return r;
  }
  rados_conf_parse_env (st->cluster, NULL);
  /* No cache between the device and the OSDs (see the top); a trim of
   * part of an object zeroes it, as a trim of a file does, rather than
   * being skipped.
   */
  rados_conf_set (st->cluster, "rbd_cache", "false");
  rados_conf_set (st->cluster, "rbd_skip_partial_discard", "false");
  /* --io-timeout, over the configuration's: a request to an OSD, or to
   * a monitor (a map, a lock), fails with -ETIMEDOUT in that time.
   */
  if (st->io_timeout) {
    char secs[16];

    snprintf (secs, sizeof secs, "%u", st->io_timeout);
    rados_conf_set (st->cluster, "rados_osd_op_timeout", secs);
    rados_conf_set (st->cluster, "rados_mon_op_timeout", secs);
  }
  r = rados_connect (st->cluster);
  if (r < 0) {
    snprintf (err, errlen, "%s: connecting to the Ceph cluster as "
              "client.%s: %s", st->name, who,
              r == -ENOENT ? "no keyring for that user"
              : r == -ETIMEDOUT ? "no monitor answered"
              : r == -EACCES || r == -EPERM ? "cephx refused the key"
              : strerror (-r));
    return r;
  }
  /* Without it, a timeout the configuration sets, for the notices. */
  if (st->io_timeout == 0) {
    char secs[32];

    if (rados_conf_get (st->cluster, "rados_osd_op_timeout", secs,
                        sizeof secs) == 0)
      st->io_timeout = (unsigned) strtoul (secs, NULL, 10);
  }
  r = rados_ioctx_create (st->cluster, st->pool, &st->ioctx);
  if (r < 0) {
    st->ioctx = NULL;
    snprintf (err, errlen, "%s: %s", st->name,
              r == -ENOENT ? "no such pool" : strerror (-r));
    return r;
  }
  return 0;
}

/* The lock holder recorded in PATH by a server before us, in OWNER. */
static bool
read_record (const char *path, char *owner, size_t len)
{
  FILE *f = path ? fopen (path, "re") : NULL;
  bool ok = f && fgets (owner, (int) len, f) != NULL;

  if (f)
    fclose (f);
  if (ok)
    owner[strcspn (owner, "\n")] = '\0';
  return ok && owner[0] != '\0';
}

/* Records us, the lock's holder now, in PATH (best effort: without it a
 * successor waits for librbd instead).
 */
static void
write_record (struct rbd_store *st, const char *path)
{
  rbd_lock_mode_t mode;
  char *owners[1];
  size_t n = 1;
  FILE *f;

  if (path == NULL || rbd_lock_get_owners (st->rbd, &mode, owners, &n) != 0)
    return;
  if (n == 1 && (f = fopen (path, "we")) != NULL) {
    fprintf (f, "%s\n", owners[0]);
    fclose (f);
  }
  rbd_lock_get_owners_cleanup (owners, n);
}

/* When the lock's holder is the one recorded in PATH, breaks its lock
 * (which also blocklists it: were it alive after all, it could write no
 * more) so that the caller can take it.
 */
static void
break_recorded (struct rbd_store *st, const char *path)
{
  char recorded[256];
  rbd_lock_mode_t mode;
  char *owners[4];
  size_t n = 4;
  bool match;

  if (!read_record (path, recorded, sizeof recorded) ||
      rbd_lock_get_owners (st->rbd, &mode, owners, &n) != 0)
    return;
  match = n == 1 && strcmp (owners[0], recorded) == 0;
  rbd_lock_get_owners_cleanup (owners, n);
  if (match)
    rbd_lock_break (st->rbd, RBD_LOCK_MODE_EXCLUSIVE, recorded);
}

/* Takes the image's exclusive lock, or says who holds it. */
static int
take_lock (struct rbd_store *st, const char *record, char *err,
           size_t errlen)
{
  uint64_t features = 0;
  rbd_lock_mode_t mode;
  char *owners[4];
  size_t n = 4;
  int r;

  if (rbd_get_features (st->rbd, &features) == 0 &&
      !(features & RBD_FEATURE_EXCLUSIVE_LOCK)) {
    snprintf (err, errlen, "%s: the image has no exclusive-lock feature, "
              "so its use by one writer cannot be ensured (`rbd feature "
              "enable IMAGE exclusive-lock`, or --shared)", st->name);
    return -EINVAL;
  }
  /* First: asked for the lock, a dead holder would keep librbd waiting
   * for its answer (rbd_request_timed_out_seconds, 30 s).
   */
  break_recorded (st, record);
  r = rbd_lock_acquire (st->rbd, RBD_LOCK_MODE_EXCLUSIVE);
  if (r == 0) {
    st->locked = true;
    write_record (st, record);
    return 0;
  }
  if (rbd_lock_get_owners (st->rbd, &mode, owners, &n) == 0 && n > 0) {
    snprintf (err, errlen, "%s is in use: %s holds its exclusive lock "
              "(--shared to write it alongside)", st->name, owners[0]);
    rbd_lock_get_owners_cleanup (owners, n);
  }
  else
    snprintf (err, errlen, "%s: taking its exclusive lock: %s", st->name,
              strerror (-r));
  return r;
}

static int
open_image (struct rbd_store *st, const struct mloop_engine_config *cfg,
            char *err, size_t errlen)
{
  const bool writable = cfg->want_write && st->snap == NULL;
  int r = writable ? rbd_open (st->ioctx, st->image, &st->rbd, NULL)
    : rbd_open_read_only (st->ioctx, st->image, &st->rbd, st->snap);

  if (r < 0) {
    st->rbd = NULL;
    if (r == -ENOENT && st->snap)
      snprintf (err, errlen, "%s: no such image or snapshot", st->name);
    else
      snprintf (err, errlen, "%s: %s", st->name,
                r == -ENOENT ? "no such image" : strerror (-r));
    return r;
  }
  if (writable && !st->shared &&
      (r = take_lock (st, cfg->lock_record, err, errlen)) < 0)
    return r;
  if ((r = read_size (st)) < 0) {
    snprintf (err, errlen, "%s: reading its size: %s", st->name,
              strerror (-r));
    return r;
  }
  if (rbd_update_watch (st->rbd, &st->watch_handle, on_image_update, st)
      == 0)
    st->watching = true;
  st->base.info = (struct mloop_store_info) {
    .writable = writable,
    .preferred_block_size = RBD_BLOCK_SIZE,
    .buffer_alignment = 1,
    .direct = true,
    .can_extents = true,
  };
  return 0;
}

int mloop_rbd_store_module_open (struct mloop_store **out,
                                 const struct mloop_engine_config *cfg,
                                 char *err, size_t errlen);

/* The module's entry point (rbd_load.h). */
int
mloop_rbd_store_module_open (struct mloop_store **out,
                             const struct mloop_engine_config *cfg,
                             char *err, size_t errlen)
{
  struct rbd_store *st = calloc (1, sizeof *st);
  int r;

  if (st == NULL || (st->name = strdup (cfg->path)) == NULL) {
    free (st);
    snprintf (err, errlen, "no memory for %s", cfg->path);
    return -ENOMEM;
  }
  st->base.ops = &rbd_ops;
  st->io_timeout = cfg->io_timeout;
  st->notice = cfg->notice;
  pthread_mutex_init (&st->silence_lock, NULL);
  r = parse_name (st, cfg, err, errlen);
  if (r == 0 && (cfg->window.offset || cfg->window.sizelimit)) {
    snprintf (err, errlen, "%s: --offset and --sizelimit are for files: "
              "an RBD image is served whole", st->name);
    r = -EINVAL;
  }
  if (r == 0 && cfg->overlay) {
    snprintf (err, errlen, "%s: an overlay over an RBD image is not "
              "supported (an RBD clone is Ceph's own)", st->name);
    r = -ENOTSUP;
  }
  if (r == 0)
    r = connect_cluster (st, err, errlen);
  if (r == 0)
    r = open_image (st, cfg, err, errlen);
  if (r < 0) {
    store_close (&st->base);
    return r;
  }
  *out = &st->base;
  return 0;
}
