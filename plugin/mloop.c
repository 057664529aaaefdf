/* nbdkit-mloop-plugin — serve an image through mloop's AIO engine.
 *
 * This file is the nbdkit adapter only: parameters, the callback table,
 * and translating engine results into nbdkit errors.  All IO lives in the
 * shared engine (engine/).
 *
 * Thread model: NBDKIT_THREAD_MODEL_PARALLEL.  Each of nbdkit's threads
 * calling pread/pwrite submits its request straight into one of the
 * engine's AIO rings (engine/aio_pool.h) and sleeps until it completes:
 * by default the waiting threads take turns reaping the ring themselves,
 * so no thread of ours stands between them and the kernel.  The engine
 * is started in .after_fork because threads and AIO contexts do not
 * survive nbdkit's daemonizing fork.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "engine.h"
#include "pooled.h"
#include "io_rights.h"
#include "memory_pressure.h"
#include "nbd_proto.h"
#include "space.h"
#include "stats.h"
#include "trace.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static char *filename;
static struct mloop_engine_config config;
static bool discard = true;             /* discard=on|off */
static char *stats_file;                /* stats=FILE, for mloop status */
static char *trace_file;                /* trace=FILE, else $MLOOP_TRACE */
static char *overlay_file;              /* overlay=FILE */
static char *ceph_conf;                 /* ceph-conf=FILE */
static char *ceph_id;                   /* ceph-id=NAME */
static char *lock_record;               /* lock-record=FILE */
static bool is_rbd;                     /* rbd=POOL/IMAGE, not file= */
/* readonly=on: open the image read-only.  nbdkit tells a plugin of its
 * -r only per connection, after the image is open; an RBD image opened
 * for writing takes its exclusive lock (refusing a live writer,
 * breaking a dead one's lock), which a read-only server must not.
 */
static bool read_only;
static bool lock_memory;                /* mlock=on|off */
static struct mloop_stats *stats;       /* its counters, or NULL */
static struct mloop_engine engine;
static unsigned rings = MLOOP_RINGS_DEFAULT;   /* threads= */
static unsigned queue_depth = MLOOP_QUEUE_DEPTH_DEFAULT;
static struct mloop_pooled pooled;      /* the engine through AIO rings */
static bool engine_open;

/* -D mloop.reaper_threads=1: reap completions on a dedicated thread per ring
 * instead of on the waiting nbdkit threads (for comparison; see
 * docs/design.md).
 */
NBDKIT_DLL_PUBLIC int mloop_debug_reaper_threads = 0;

/* The store's notices (engine.h): nbdkit has no call for a warning,
 * and its error call is the one that reaches its log (stderr, or
 * syslog once it has daemonized).
 */
static void
say_notice (const char *line)
{
  nbdkit_error ("mloop: %s", line);
}

static void
mloop_load (void)
{
  mloop_engine_config_init (&config);
  config.notice = say_notice;
}

static void
mloop_unload (void)
{
  if (engine_open)
    mloop_engine_close (&engine);
  engine_open = false;
  mloop_stats_close (stats);
  free (stats_file);
  free (trace_file);
  free (overlay_file);
  free (ceph_conf);
  free (ceph_id);
  free (lock_record);
  free (filename);
}

/* Parses an unsigned parameter in [MIN, MAX], naming it in the error. */
static int
parse_bounded (const char *key, const char *value, unsigned min,
               unsigned max, unsigned *out)
{
  uint32_t v;

  if (nbdkit_parse_uint32_t (key, value, &v) == -1)
    return -1;
  if (v < min || v > max) {
    nbdkit_error ("%s=%s: must be between %u and %u", key, value, min, max);
    return -1;
  }
  *out = v;
  return 0;
}

static int
mloop_config (const char *key, const char *value)
{
  if (strcmp (key, "file") == 0) {
    /* Resolved now because nbdkit changes directory when it daemonizes;
     * but a name of a descriptor is kept, to be served as the open file
     * it is (backing.h), not resolved to a name to open again.
     */
    free (filename);
    filename = mloop_backing_named_descriptor (value) >= 0 ? strdup (value)
      : realpath (value, NULL);
    if (filename == NULL) {
      nbdkit_error ("file=%s: %m", value);
      return -1;
    }
  }
  else if (strcmp (key, "rbd") == 0) {
    free (filename);
    if (asprintf (&filename, "%s%s", MLOOP_RBD_PREFIX, value) == -1) {
      filename = NULL;
      nbdkit_error ("rbd=%s: %m", value);
      return -1;
    }
    is_rbd = true;
  }
  else if (strcmp (key, "ceph-conf") == 0) {
    free (ceph_conf);
    if ((ceph_conf = nbdkit_absolute_path (value)) == NULL)
      return -1;
    config.ceph_conf = ceph_conf;
  }
  else if (strcmp (key, "ceph-id") == 0) {
    free (ceph_id);
    if ((ceph_id = strdup (value)) == NULL) {
      nbdkit_error ("ceph-id=%s: %m", value);
      return -1;
    }
    config.ceph_id = ceph_id;
  }
  else if (strcmp (key, "lock-record") == 0) {
    free (lock_record);
    if ((lock_record = nbdkit_absolute_path (value)) == NULL)
      return -1;
    config.lock_record = lock_record;
  }
  else if (strcmp (key, "shared") == 0) {
    if (mloop_on_off_parse (value, &config.shared) < 0) {
      nbdkit_error ("shared=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "readonly") == 0) {
    if (mloop_on_off_parse (value, &read_only) < 0) {
      nbdkit_error ("readonly=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "io-timeout") == 0)
    return parse_bounded (key, value, 0, INT_MAX, &config.io_timeout);
  else if (strcmp (key, "threads") == 0)
    return parse_bounded (key, value, 1, MLOOP_RINGS_MAX, &rings);
  else if (strcmp (key, "queue-depth") == 0)
    return parse_bounded (key, value, 1, MLOOP_QUEUE_DEPTH_MAX,
                          &queue_depth);
  else if (strcmp (key, "discard") == 0) {
    /* Not nbdkit_parse_bool: its error would not name the parameter. */
    if (mloop_on_off_parse (value, &discard) < 0) {
      nbdkit_error ("discard=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "mlock") == 0) {
    if (mloop_on_off_parse (value, &lock_memory) < 0) {
      nbdkit_error ("mlock=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "stats") == 0) {
    free (stats_file);
    stats_file = strdup (value);
    if (stats_file == NULL) {
      nbdkit_error ("stats=%s: %m", value);
      return -1;
    }
  }
  else if (strcmp (key, "trace") == 0) {
    free (trace_file);
    trace_file = strdup (value);
    if (trace_file == NULL) {
      nbdkit_error ("trace=%s: %m", value);
      return -1;
    }
  }
  else if (strcmp (key, "offset") == 0 || strcmp (key, "sizelimit") == 0) {
    /* Sizes like losetup's --offset and --sizelimit (suffixes K, M, G,
     * T), parsed as mloop-server parses them.
     */
    uint64_t *to = key[0] == 'o' ? &config.window.offset
      : &config.window.sizelimit;

    if (mloop_size_parse (value, to) < 0) {
      nbdkit_error ("%s=%s: must be a size in bytes (suffixes K, M, G, T)",
                    key, value);
      return -1;
    }
  }
  else if (strcmp (key, "overlay") == 0) {
    free (overlay_file);
    overlay_file = nbdkit_absolute_path (value);
    if (overlay_file == NULL)
      return -1;
    config.overlay = overlay_file;
  }
  else if (strcmp (key, "overlay-adopt-base") == 0) {
    if (mloop_on_off_parse (value, &config.overlay_adopt_base) < 0) {
      nbdkit_error ("overlay-adopt-base=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "overlay-must-exist") == 0) {
    if (mloop_on_off_parse (value, &config.overlay_must_exist) < 0) {
      nbdkit_error ("overlay-must-exist=%s: must be on or off", value);
      return -1;
    }
  }
  else if (strcmp (key, "direct") == 0) {
    if (mloop_direct_mode_parse (value, &config.direct) < 0) {
      nbdkit_error ("direct=%s: must be auto, on or off", value);
      return -1;
    }
  }
  else {
    nbdkit_error ("unknown parameter '%s' (see nbdkit mloop --help)", key);
    return -1;
  }
  return 0;
}

static int
mloop_config_complete (void)
{
  if (filename == NULL) {
    nbdkit_error ("file= or rbd=: the image file, block device or RBD "
                  "image to serve is required");
    return -1;
  }
  return 0;
}

#define mloop_config_help \
  "file=<FILENAME>     Image file or block device to serve, or:\n" \
  "rbd=POOL/IMAGE[@SNAP]  a Ceph RBD image (a snapshot is read-only).\n" \
  "ceph-conf=FILE      For rbd=: the Ceph configuration (default: librados's).\n" \
  "ceph-id=NAME        For rbd=: the cephx user, without client. (default admin).\n" \
  "shared=on|off       For rbd=: write without the exclusive lock (default off).\n" \
  "readonly=on|off     Open the image read-only: give it with -r, which an\n" \
  "                    RBD image's lock needs known at the open (default off).\n" \
  "lock-record=FILE    For rbd=: record the lock's holder; break a dead one's.\n" \
  "io-timeout=SECONDS  For rbd=: fail a request with EIO when the cluster\n" \
  "                    has not answered it in this time (default 0: wait).\n" \
  "threads=<N>         AIO rings (kernel AIO contexts), 1..64 (default 4).\n" \
  "queue-depth=<N>     AIO requests in flight per ring (default 32).\n" \
  "direct=auto|on|off  O_DIRECT: auto falls back to buffered IO with a\n" \
  "                    warning, on refuses to start (default auto).\n" \
  "discard=on|off      Honour TRIM: punch holes / BLKDISCARD (default on).\n" \
  "offset=<SIZE>       Serve the image from this byte on (default 0).\n" \
  "sizelimit=<SIZE>    Serve at most this many bytes (default: to the end).\n" \
  "overlay=FILE        Write to this copy-on-write overlay (made if absent);\n" \
  "                    the file is then only read.\n" \
  "overlay-adopt-base=on|off\n" \
  "                    Use the overlay over this file though it was made\n" \
  "                    for another, and record this one (default off).\n" \
  "overlay-must-exist=on|off\n" \
  "                    Refuse to start without the overlay, never make it\n" \
  "                    (a device's restarted server; default off).\n" \
  "stats=FILE          Keep request counters in FILE (for mloop status).\n" \
  "trace=FILE          Append a line per request event to FILE\n" \
  "                    (default: $MLOOP_TRACE, else none).\n" \
  "mlock=on|off        Lock the server's memory with mlockall (default off)."

static int
open_engine (void)
{
  char err[512], what[512];

  config.path = filename;
  config.want_write = !read_only;
  if (mloop_engine_open (&engine, &config, err, sizeof err) < 0) {
    nbdkit_error ("%s", err);
    return -1;
  }
  engine_open = true;
  mloop_engine_describe (&engine, what, sizeof what);
  nbdkit_debug ("mloop: %s", what);
  return 0;
}

/* Opens a file before nbdkit forks, so that a missing or unusable file
 * makes nbdkit exit at startup.  An RBD image is opened after the fork
 * (.after_fork): librados starts threads, which a fork does not keep.
 */
static int
mloop_get_ready (void)
{
  char err[512];

  if (!is_rbd && open_engine () < 0)
    return -1;
  /* The rings are opened after the fork: a system at fs.aio-max-nr is
   * refused here, while our messages still reach the caller.
   */
  if (mloop_aio_check_room (err, sizeof err) < 0) {
    nbdkit_error ("%s", err);
    return -1;
  }
  /* Shared mapping: it survives nbdkit's daemonizing fork. */
  if (stats_file && (stats = mloop_stats_create (stats_file)) == NULL) {
    nbdkit_error ("stats=%s: %m", stats_file);
    return -1;
  }
  /* Opened before the fork, so a relative path means nbdkit's start
   * directory; every event is written at once (nbdkit's threads block
   * in the plugin anyway).
   */
  if (trace_file == NULL && getenv ("MLOOP_TRACE") && *getenv ("MLOOP_TRACE"))
    trace_file = strdup (getenv ("MLOOP_TRACE"));
  if (trace_file && mloop_trace_open (trace_file, true) == -1) {
    nbdkit_error ("trace=%s: %m", trace_file);
    return -1;
  }
  if (engine_open && mloop_engine_info (&engine)->direct_fell_back)
    /* nbdkit has no warning call; stderr is still the terminal here,
     * before the daemonizing fork.
     */
    fprintf (stderr, "nbdkit: mloop: warning: file=%s: O_DIRECT not "
             "supported here, using buffered IO (direct=on would refuse "
             "to start)\n", filename);
  return 0;
}

static int
mloop_after_fork (void)
{
  char err[512];

  enum mloop_pool_mode mode = mloop_debug_reaper_threads
    ? MLOOP_POOL_REAPER_THREADS : MLOOP_POOL_CALLER_REAPS;

  if (!engine_open && open_engine () < 0)
    return -1;
  /* Here, not in .get_ready: memory locks are not inherited across
   * nbdkit's daemonizing fork.
   */
  if (lock_memory && (errno = -mloop_lock_memory ()) != 0) {
    nbdkit_error ("mlock=on: mlockall: %m");
    return -1;
  }
  if (mloop_pooled_start (&pooled, &engine, rings, queue_depth, mode,
                          err, sizeof err) < 0) {
    nbdkit_error ("%s", err);
    return -1;
  }
  if (mloop_aio_pool_limited (pooled.pool)) {
    mloop_aio_limit_message (err, sizeof err, rings * (queue_depth + 1));
    nbdkit_error ("%s; serving with smaller AIO rings", err);
  }
  nbdkit_debug ("mloop: %u AIO rings (%s), queue depth %u", rings,
                mloop_debug_reaper_threads ? "reaper threads" : "callers reap",
                queue_depth);
  return 0;
}

/* Stops the ring pool once every connection is gone (before unload). */
static void
mloop_cleanup (void)
{
  if (pooled.pool)
    mloop_pooled_stop (&pooled);
}

/* One engine serves every connection; the handle only numbers the
 * connection, for the trace.
 */
struct mloop_handle {
  unsigned id;
};

static void *
mloop_open (int readonly)
{
  static unsigned next_id;
  struct mloop_handle *h = malloc (sizeof *h);

  if (h == NULL) {
    nbdkit_error ("malloc: %m");
    return NULL;
  }
  h->id = __atomic_add_fetch (&next_id, 1, __ATOMIC_RELAXED);
  MLOOP_STATS_ADD (stats, connections, 1);
  MLOOP_STATS_ADD (stats, connections_total, 1);
  return h;
}

static void
mloop_close (void *handle)
{
  MLOOP_STATS_SUB (stats, connections, 1);
  free (handle);
}

static int64_t
mloop_get_size (void *handle)
{
  return (int64_t) mloop_engine_size (&engine);
}

static int
mloop_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                  uint32_t *maximum)
{
  *minimum = MLOOP_MIN_BLOCK_SIZE;
  *preferred = mloop_engine_info (&engine)->preferred_block_size;
  *maximum = MLOOP_MAX_REQUEST;
  return 0;
}

static int
mloop_can_write (void *handle)
{
  return mloop_engine_info (&engine)->writable;
}

static int
mloop_can_flush (void *handle)
{
  return 1;
}

static int
mloop_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
mloop_can_trim (void *handle)
{
  return discard && mloop_engine_info (&engine)->writable;
}

static int
mloop_can_zero (void *handle)
{
  return 1;                     /* .zero does it natively */
}

/* Fast zero is honest: the engine refuses with ENOTSUP, changing
 * nothing, whenever only writing zeroes would do.
 */
static int
mloop_can_fast_zero (void *handle)
{
  return 1;
}

/* Block devices have no holes to report; nbdkit then reports all data. */
static int
mloop_can_extents (void *handle)
{
  return mloop_engine_info (&engine)->can_extents;
}

/* NBD_CMD_CACHE is not advertised: mloop reads with O_DIRECT, so a
 * prefetch into the page cache would warm nothing mloop reads, and
 * reading ahead into memory of our own would double-cache the image.
 */
static int
mloop_can_cache (void *handle)
{
  return NBDKIT_CACHE_NONE;
}

/* Safe because every connection shares one engine and one file: a flush
 * (fdatasync) on any connection covers writes completed on all of them,
 * and O_DIRECT writes are visible to every reader once completed.
 */
static int
mloop_can_multi_conn (void *handle)
{
  return 1;
}

/* The request this thread is serving, for the trace: nbdkit calls the
 * plugin only once it has received a request (and a write's payload), and
 * sends the reply after the callback returns, so the plugin sees neither
 * the cookie nor the reply; it numbers requests itself (seq=).
 */
static __thread struct {
  unsigned conn;
  uint64_t seq;
  uint16_t cmd;
} current;

/* Counts a request as started, for `mloop status`, and traces it. */
static void
begin (void *handle, uint16_t cmd, uint32_t count, uint64_t offset)
{
  static uint64_t next_seq;

  /* nbdkit's threads do the device's IO: keep them out of reclaim, with
   * no right beyond the open file's when the image is a descriptor's.
   */
  mloop_io_thread ();
  MLOOP_STATS_ADD (stats, in_flight, 1);
  if (mloop_trace_enabled) {
    current.conn = ((struct mloop_handle *) handle)->id;
    current.seq = __atomic_add_fetch (&next_seq, 1, __ATOMIC_RELAXED);
    current.cmd = cmd;
    mloop_trace_record (MLOOP_TRACE_RECV, current.conn, NULL, current.seq,
                        cmd, offset, count, 0);
  }
}

/* Turns an engine error into an nbdkit error with one log line, and
 * counts the request as answered.
 */
static int
report (int r, enum mloop_stats_command c, const char *what, uint32_t count,
        uint64_t offset)
{
  if (stats) {
    MLOOP_STATS_ADD (stats, requests[c], 1);
    MLOOP_STATS_SUB (stats, in_flight, 1);
    if (r != 0)
      MLOOP_STATS_ADD (stats, errors, 1);
    else if (r == 0 && c == MLOOP_STATS_READ)
      MLOOP_STATS_ADD (stats, bytes_read, count);
    else if (r == 0 && c == MLOOP_STATS_WRITE)
      MLOOP_STATS_ADD (stats, bytes_written, count);
  }
  MLOOP_TRACE (MLOOP_TRACE_RETURN, current.conn, NULL, current.seq,
               current.cmd, offset, count, -r);
  if (r == 0)
    return 0;
  nbdkit_error ("%s: %" PRIu32 " bytes at offset %" PRIu64 ": %s",
                what, count, offset, strerror (-r));
  nbdkit_set_error (-r);
  return -1;
}

static int
mloop_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  begin (handle, NBD_CMD_READ, count, offset);
  return report (mloop_pooled_pread (&pooled, buf, count, offset),
                 MLOOP_STATS_READ, "pread", count, offset);
}

static int
mloop_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  unsigned io_flags = (flags & NBDKIT_FLAG_FUA) ? MLOOP_IO_FUA : 0;

  begin (handle, NBD_CMD_WRITE, count, offset);
  return report (mloop_pooled_pwrite (&pooled, buf, count, offset, io_flags),
                 MLOOP_STATS_WRITE, "pwrite", count, offset);
}

static int
mloop_flush (void *handle, uint32_t flags)
{
  begin (handle, NBD_CMD_FLUSH, 0, 0);
  return report (mloop_pooled_flush (&pooled), MLOOP_STATS_FLUSH, "flush",
                 0, 0);
}

static int
mloop_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  unsigned f = (flags & NBDKIT_FLAG_FUA) ? MLOOP_IO_FUA : 0;

  begin (handle, NBD_CMD_TRIM, count, offset);
  return report (mloop_engine_trim (&engine, offset, count, f),
                 MLOOP_STATS_TRIM, "trim", count, offset);
}

static int
mloop_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  unsigned f = 0;
  int r;

  if (flags & NBDKIT_FLAG_FUA)
    f |= MLOOP_IO_FUA;
  if (!(flags & NBDKIT_FLAG_MAY_TRIM))
    f |= MLOOP_ZERO_NO_HOLE;
  if (flags & NBDKIT_FLAG_FAST_ZERO)
    f |= MLOOP_ZERO_FAST;
  begin (handle, NBD_CMD_WRITE_ZEROES, count, offset);
  r = mloop_engine_zero (&engine, offset, count, f);
  if (r == -ENOTSUP && (flags & NBDKIT_FLAG_FAST_ZERO)) {
    /* Expected, not an IO error: the client falls back to writing. */
    report (0, MLOOP_STATS_ZERO, "zero", count, offset);
    nbdkit_set_error (ENOTSUP);
    return -1;
  }
  return report (r, MLOOP_STATS_ZERO, "zero", count, offset);
}

static int
add_extent (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  uint32_t type = hole ? NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO : 0;

  return nbdkit_add_extent (opaque, offset, length, type) == -1 ? -ENOMEM : 0;
}

static int
mloop_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct nbdkit_extents *extents)
{
  bool req_one = flags & NBDKIT_FLAG_REQ_ONE;

  begin (handle, NBD_CMD_BLOCK_STATUS, count, offset);
  return report (mloop_engine_extents (&engine, offset, count, req_one,
                                       add_extent, extents),
                 MLOOP_STATS_OTHER, "extents", count, offset);
}

static struct nbdkit_plugin plugin = {
  .name              = "mloop",
  .longname          = "mloop: image files through kernel AIO rings",
  .version           = PACKAGE_VERSION,
  .load              = mloop_load,
  .unload            = mloop_unload,
  .config            = mloop_config,
  .config_complete   = mloop_config_complete,
  .config_help       = mloop_config_help,
  .magic_config_key  = "file",
  .get_ready         = mloop_get_ready,
  .after_fork        = mloop_after_fork,
  .cleanup           = mloop_cleanup,
  .open              = mloop_open,
  .close             = mloop_close,
  .get_size          = mloop_get_size,
  .block_size        = mloop_block_size,
  .can_write         = mloop_can_write,
  .can_flush         = mloop_can_flush,
  .can_fua           = mloop_can_fua,
  .can_multi_conn    = mloop_can_multi_conn,
  .pread             = mloop_pread,
  .pwrite            = mloop_pwrite,
  .flush             = mloop_flush,
  .can_trim          = mloop_can_trim,
  .can_zero          = mloop_can_zero,
  .can_fast_zero     = mloop_can_fast_zero,
  .can_extents       = mloop_can_extents,
  .can_cache         = mloop_can_cache,
  .trim              = mloop_trim,
  .zero              = mloop_zero,
  .extents           = mloop_extents,
  .errno_is_preserved = 0,
};

NBDKIT_REGISTER_PLUGIN (plugin)
