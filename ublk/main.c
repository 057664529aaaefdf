/* mloop-ublk — serves an image file or block device as /dev/ublkbN
 * through the kernel's ublk driver, on mloop's IO engine.
 *
 * `mloop attach --transport ublk` starts it the way it starts
 * mloop-server: detached, stdout and stderr into a log.  The contract:
 * --device-file receives "/dev/ublkbN" once the device serves, then
 * --pid-file our pid, and only then; every failure is one line on
 * stderr, "mloop-ublk: <cause>", exit 1, with no device and no pid file
 * left behind.  SIGTERM or SIGINT stops the device, joins the queues,
 * deletes the device and exits 0; the files are the starter's to
 * remove.  --delete N removes a device a killed mloop-ublk left behind.
 *
 * User recovery (docs/design.md, "The ublk transport"): --recovery adds
 * the device so that, when we die, the kernel quiesces it and holds its
 * IO; `--recover N IMAGE` takes it over — checks, START_USER_RECOVERY,
 * the queues fetch, then END_USER_RECOVERY — and serves it as if it had
 * added it.  Until it serves, a failure leaves the device quiesced (not
 * deleted), and says so on its one line.
 *
 * Order of start (docs/design.md): AIO contexts and helpers first (the
 * room in fs.aio-max-nr decides the depth ADD_DEV is given), ADD_DEV,
 * SET_PARAMS, the queue threads, then START_DEV, which blocks until
 * every queue has fetched every tag.  Teardown runs the other way round:
 * STOP_DEV, join the queues, stop the helpers, close /dev/ublkcN,
 * DEL_DEV (which waits for that close).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include "aio_ring.h"
#include "control.h"
#include "counters.h"
#include "delete.h"
#include "engine.h"
#include "offload.h"
#include "queue.h"
#include "rbd_options.h"
#include "stats.h"

/* coreutils', which Debian installs everywhere: fsync of each file named. */
#define SYNC_PROGRAM "/bin/sync"

#define MAX_QUEUES 16
#define DEPTH_DEFAULT 64
/* The largest request the kernel sends us: each tag has a buffer this
 * big (512 KiB × 64 tags = 32 MiB per queue). */
#define MAX_IO_BYTES (512u << 10)
/* Discards and write-zeroes of up to this much come as one request. */
#define MAX_DISCARD_BYTES (1u << 30)
/* Our own DEL_DEV waits for /dev/ublkcN to be closed by everyone; if
 * something else holds it (a stray open of the character device), say so
 * instead of hanging. */
#define DEL_TIMEOUT_MS 30000
/* --recover: START_USER_RECOVERY says EBUSY until the dead server's
 * /dev/ublkcN is released and the device quiesced (docs/design.md has
 * how long that takes); retry that long. */
#define RECOVER_WAIT_MS 10000

static gint opt_queues;
static gint opt_depth;           /* 0: DEPTH_DEFAULT, or the device's */
static gboolean opt_read_only;
static gchar *opt_direct;
static gboolean opt_buffered;
static gchar *opt_offset;
static gchar *opt_sizelimit;
static gchar *opt_overlay;
static gboolean opt_overlay_adopt_base;
static gchar *opt_ceph_conf;
static gchar *opt_ceph_id;
static gboolean opt_shared;
static gchar *opt_lock_record;
static gint opt_io_timeout;
static gint opt_block_size;
static gchar *opt_device_file;
static gchar *opt_pid_file;
static gchar *opt_stats_file;
static gboolean opt_legacy;
static gboolean opt_version;
static gint opt_delete = -1;
static gboolean opt_recovery;
static gint opt_recover = -1;
static gint opt_id = -1;         /* -1: the kernel picks the number */

static GOptionEntry entries[] = {
  { "queues", 'q', 0, G_OPTION_ARG_INT, &opt_queues,
    "Hardware queues, 1..16 (default: the number of CPUs, at most 16)", "N" },
  { "depth", 'd', 0, G_OPTION_ARG_INT, &opt_depth,
    "Requests in flight per queue, 1..4096 (default 64)", "N" },
  { "read-only", 'r', 0, G_OPTION_ARG_NONE, &opt_read_only,
    "Serve read-only", NULL },
  { "direct", 0, 0, G_OPTION_ARG_STRING, &opt_direct,
    "O_DIRECT: auto (default), on or off", "MODE" },
  { "buffered", 0, 0, G_OPTION_ARG_NONE, &opt_buffered,
    "Same as --direct=off", NULL },
  { "offset", 'o', 0, G_OPTION_ARG_STRING, &opt_offset,
    "Serve the image from this byte on (like losetup --offset)", "SIZE" },
  { "sizelimit", 0, 0, G_OPTION_ARG_STRING, &opt_sizelimit,
    "Serve at most this many bytes (like losetup --sizelimit)", "SIZE" },
  { "overlay", 0, 0, G_OPTION_ARG_FILENAME, &opt_overlay,
    "Write to this copy-on-write overlay (made if absent); the image is "
    "only read", "FILE" },
  { "overlay-adopt-base", 0, 0, G_OPTION_ARG_NONE, &opt_overlay_adopt_base,
    "Use the overlay over this image though it was made for another, and "
    "record this image as its base", NULL },
  MLOOP_RBD_SERVER_OPTION_ENTRIES (opt_ceph_conf, opt_ceph_id, opt_shared,
                                   opt_lock_record, opt_io_timeout),
  { "block-size", 0, 0, G_OPTION_ARG_INT, &opt_block_size,
    "Logical block size to offer: 512, 1024, 2048 or 4096 (default: the "
    "image's)", "BYTES" },
  { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &opt_stats_file,
    "Keep request counters here for mloop status (like mloop-server's)",
    "FILE" },
  { "device-file", 0, 0, G_OPTION_ARG_FILENAME, &opt_device_file,
    "Write the device's path here once it serves", "FILE" },
  { "pid-file", 'P', 0, G_OPTION_ARG_FILENAME, &opt_pid_file,
    "Write the pid here once the device serves (after --device-file)",
    "FILE" },
  { "legacy-opcodes", 0, 0, G_OPTION_ARG_NONE, &opt_legacy,
    "Send Linux 6.1's bare control command numbers instead of the "
    "ioctl-encoded ones (IO commands stay encoded)",
    NULL },
  { "delete", 0, 0, G_OPTION_ARG_INT, &opt_delete,
    "Stop and delete ublk device N (left behind by a killed mloop-ublk), "
    "then exit", "N" },
  { "id", 'n', 0, G_OPTION_ARG_INT, &opt_id,
    "Add the device as /dev/ublkbN (default: the first free number)", "N" },
  { "recovery", 0, 0, G_OPTION_ARG_NONE, &opt_recovery,
    "Add the device with user recovery: if we die, it waits (IO held) for "
    "another mloop-ublk --recover N", NULL },
  { "recover", 0, 0, G_OPTION_ARG_INT, &opt_recover,
    "Take over ublk device N (added with --recovery) whose server died, "
    "serving IMAGE again", "N" },
  { "version", 'V', 0, G_OPTION_ARG_NONE, &opt_version,
    "Print the version and exit", NULL },
  G_OPTION_ENTRY_NULL
};

/* Before anything exists that would need cleaning up. */
static void G_GNUC_NORETURN G_GNUC_PRINTF (1, 2)
die (const char *fmt, ...)
{
  va_list ap;

  fputs ("mloop-ublk: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (EXIT_FAILURE);
}

/* Once there is something to clean up: the first failure is the one
 * reported, after the cleanup, as the last line of the log; what fails
 * while cleaning up after it is a consequence. */
static char failure[1024];

static void G_GNUC_PRINTF (1, 2)
fail (const char *fmt, ...)
{
  va_list ap;

  if (failure[0])
    return;
  va_start (ap, fmt);
  vsnprintf (failure, sizeof failure, fmt, ap);
  va_end (ap);
}

static uint64_t
parse_size (const char *name, const char *value)
{
  uint64_t n;

  if (value == NULL)
    return 0;
  if (mloop_size_parse (value, &n) < 0)
    die ("--%s=%s: must be a size in bytes (suffixes K, M, G, T)", name, value);
  return n;
}

static void
check_options (int argc)
{
  if (opt_recover < -1)
    die ("--recover=%d: must be a ublk device number", opt_recover);
  if (opt_id < -1)
    die ("--id=%d: must be a ublk device number", opt_id);
  if (opt_id >= 0 && (opt_recover >= 0 || opt_delete >= 0))
    die ("--id is for a new device, not with --%s",
         opt_recover >= 0 ? "recover" : "delete");
  if (opt_delete >= 0) {
    if (argc != 1)
      die ("--delete N takes no IMAGE");
    if (opt_recover >= 0)
      die ("--delete and --recover exclude each other");
    return;
  }
  if (argc != 2)
    die ("expected one IMAGE argument (see --help)");
  /* --recover: the device has its queues and depth; given ones are
   * checked against them (the starter may pass the same options again). */
  if (opt_recover < 0 && opt_queues == 0) {
    long cpus = sysconf (_SC_NPROCESSORS_ONLN);
    opt_queues = cpus < 1 ? 1 : cpus > MAX_QUEUES ? MAX_QUEUES : (gint) cpus;
  }
  /* ADD_DEV gives a device no more queues than the kernel has CPUs, and
   * a queue past those cannot be mapped: ask for what it will give. */
  long cpus_conf = sysconf (_SC_NPROCESSORS_CONF);
  if (opt_recover < 0 && cpus_conf >= 1 && opt_queues > cpus_conf) {
    fprintf (stderr, "mloop-ublk: warning: --queues=%d: this machine has %ld "
             "CPUs, and ublk no more queues than CPUs; using %ld\n",
             opt_queues, cpus_conf, cpus_conf);
    opt_queues = (gint) cpus_conf;
  }
  if (opt_recover < 0 && opt_depth == 0)
    opt_depth = DEPTH_DEFAULT;
  if (opt_queues && (opt_queues < 1 || opt_queues > MAX_QUEUES))
    die ("--queues=%d: must be between 1 and %d", opt_queues, MAX_QUEUES);
  if (opt_depth && (opt_depth < 1 || opt_depth > UBLK_MAX_QUEUE_DEPTH))
    die ("--depth=%d: must be between 1 and %d", opt_depth, UBLK_MAX_QUEUE_DEPTH);
  if (opt_block_size &&
      (opt_block_size < 512 || opt_block_size > 4096 ||
       (opt_block_size & (opt_block_size - 1))))
    die ("--block-size=%d: must be 512, 1024, 2048 or 4096", opt_block_size);
  if (opt_buffered && opt_direct && strcmp (opt_direct, "off") != 0)
    die ("--buffered and --direct=%s exclude each other", opt_direct);
  if (opt_io_timeout < 0)
    die ("--io-timeout=%d: must be 0 (wait) or more seconds", opt_io_timeout);
}

/* The store's notices (engine.h): a state that changed, once. */
static void
say_notice (const char *line)
{
  fprintf (stderr, "mloop-ublk: %s\n", line);
}

/* The engine, the block size to offer, and the size the device gets. */
static void
open_image (struct mloop_engine *engine, const char *image,
            unsigned *block_size, uint64_t *dev_size)
{
  struct mloop_engine_config cfg;
  char err[512];

  mloop_engine_config_init (&cfg);
  cfg.path = image;
  cfg.want_write = !opt_read_only;
  if (opt_buffered)
    cfg.direct = MLOOP_DIRECT_OFF;
  if (opt_direct && mloop_direct_mode_parse (opt_direct, &cfg.direct) < 0)
    die ("--direct=%s: must be auto, on or off", opt_direct);
  cfg.window.offset = parse_size ("offset", opt_offset);
  cfg.overlay = opt_overlay;
  cfg.overlay_adopt_base = opt_overlay_adopt_base;
  /* A device taken over is in use: its overlay is never made anew. */
  cfg.overlay_must_exist = opt_recover >= 0;
  cfg.ceph_conf = opt_ceph_conf;
  cfg.ceph_id = opt_ceph_id;
  cfg.shared = opt_shared;
  cfg.lock_record = opt_lock_record;
  cfg.io_timeout = (unsigned) opt_io_timeout;
  cfg.notice = say_notice;
  cfg.window.sizelimit = parse_size ("sizelimit", opt_sizelimit);
  if (mloop_engine_open (engine, &cfg, err, sizeof err) < 0)
    die ("%s", err);
  if (mloop_engine_info (engine)->direct_fell_back)
    fprintf (stderr, "mloop-ublk: warning: %s: O_DIRECT not supported "
             "here, using buffered IO\n", image);
  if (!mloop_engine_info (engine)->writable)
    opt_read_only = TRUE;       /* e.g. a file on a read-only mount */

  /* With O_DIRECT the kernel's requests must meet the image's alignment;
   * ublk's requests are whole logical blocks, so a block size below it
   * would have every small write go through a read-modify-write. */
  uint32_t align = mloop_engine_info (engine)->buffer_alignment;
  uint32_t lbs = mloop_engine_info (engine)->preferred_block_size;
  *block_size = opt_block_size ? (unsigned) opt_block_size : lbs < 512 ? 512 : lbs;
  if (*block_size > 4096 || *block_size < align) {
    mloop_engine_close (engine);
    if (opt_block_size)
      die ("--block-size=%d: below %s's %" PRIu32 "-byte O_DIRECT alignment",
           opt_block_size, image, align);
    die ("%s: a %u-byte logical block size, above ublk's 4096", image,
         *block_size);
  }
  /* ublk counts in 512-byte sectors and the block layer in blocks: the
   * device ends at the last whole block, as `mloop attach` over NBD ends
   * at the last whole sector (design.md, "The tail of an odd-sized
   * image").  Said once, not refused: the bytes before it are served. */
  uint64_t size = mloop_engine_size (engine);
  *dev_size = size - size % *block_size;
  if (*dev_size == 0) {
    mloop_engine_close (engine);
    die ("%s: %" PRIu64 " bytes, smaller than one %u-byte block", image, size,
         *block_size);
  }
  if (*dev_size != size)
    fprintf (stderr, "mloop-ublk: warning: %s: %" PRIu64 " bytes is not a "
             "multiple of the %u-byte block size; the device serves the "
             "first %" PRIu64 " (the last %" PRIu64 " bytes are not served)\n",
             image, size, *block_size, *dev_size, size - *dev_size);
}

/* One AIO context per queue, as deep as the queue if fs.aio-max-nr
 * leaves room, else as deep as it does; the depth every queue gets is
 * then the shallowest context's, so no queue has more requests than its
 * context can take.  Returns the depth, or dies (nothing else is open
 * yet) when not even a small context fits. */
static unsigned
open_aio (struct mloop_aio_ring *aio, unsigned queues, unsigned depth,
          bool exact)
{
  /* EXACT (--recover): the device's depth is fixed, so every context
   * must take all of it. */
  unsigned floor = exact ? depth
                   : depth < MLOOP_AIO_RING_FLOOR ? depth : MLOOP_AIO_RING_FLOOR;
  unsigned got = depth;
  bool limited_any = false;
  char why[512];

  for (unsigned i = 0; i < queues; i++) {
    bool limited;
    int r = mloop_aio_ring_init_fit (&aio[i], got, floor, &limited);
    if (r < 0) {
      for (unsigned j = 0; j < i; j++)
        mloop_aio_ring_destroy (&aio[j]);
      if (r == -EAGAIN)
        mloop_aio_limit_message (why, sizeof why, floor);
      else
        snprintf (why, sizeof why, "io_setup(%u): %s", got, strerror (-r));
      die ("queue %u: %s", i, why);
    }
    limited_any |= limited;
    if ((unsigned) r < got)
      got = (unsigned) r;
  }
  if (limited_any) {
    mloop_aio_limit_message (why, sizeof why, depth);
    fprintf (stderr, "mloop-ublk: warning: %s; serving with a queue depth "
             "of %u instead of %u\n", why, got, depth);
  }
  return got;
}

/* Whether PID is a process that still runs (a zombie has stopped
 * serving: its files are closed). */
static bool
pid_running (int pid)
{
  if (pid <= 0 || (kill (pid, 0) < 0 && errno == ESRCH))
    return false;
  char path[64], buf[512];
  snprintf (path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen (path, "re");
  if (!f)
    return false;
  size_t n = fread (buf, 1, sizeof buf - 1, f);
  fclose (f);
  buf[n] = '\0';
  const char *paren = strrchr (buf, ')');
  return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* Writes TEXT to PATH whole or not at all (a temporary file, then a
 * rename: GLib's "consistent" mode, as device/device_state.c writes the
 * state), so the starter never reads half a pid.  False after fail(). */
static bool
write_whole_file (const char *option, const char *path, const char *text)
{
  g_autoptr (GError) gerr = NULL;

  if (g_file_set_contents_full (path, text, -1,
                                G_FILE_SET_CONTENTS_CONSISTENT, 0644, &gerr))
    return true;
  fail ("%s %s", option, gerr->message);
  return false;
}

/* A queue of a recoverable device failed: STOP_DEV would wait for the
 * requests that queue holds and no longer serves.  Exit instead, as a
 * crash would: the kernel quiesces the device, puts those requests back,
 * and the supervisor's next mloop-ublk --recover takes them. */
static _Noreturn void
leave_for_recovery (const char *dev, const struct ublk_queue *queues,
                    unsigned n)
{
  for (unsigned i = 0; i < n; i++)
    if (queues[i].err)
      fprintf (stderr, "mloop-ublk: %s: queue %u: %s; leaving the device "
               "for --recover\n", dev, i, strerror (-queues[i].err));
  _exit (EXIT_FAILURE);
}

/* Before a stop: writes back what the page cache holds for the device.
 * With user recovery, STOP_DEV aborts the device before the kernel's own
 * write-back at its removal, so dirty pages of a buffered writer who did
 * not fsync would be lost.  The write-back is served by this process's
 * own queues, so another process waits for it: a thread of ours waiting
 * on it when we are killed (our disk stalled past a stopper's patience)
 * would keep this process from ever dying, while the queue threads'
 * deaths make user recovery hold that very write-back for a next server.
 * Killed, we die, and coreutils' sync(1) waits for the next server or
 * for the device's deletion.  It gets none of our descriptors: a ublk
 * char device or ring left open would bar a next server's recovery.  A
 * program rather than a fork of ours: a fork would copy every page our
 * queues have pinned for the kernel.
 */
static void
flush_device (const char *dev)
{
  char *argv[] = { (char *) "sync", (char *) dev, NULL };
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  sigset_t none;
  pid_t child;
  int status, r;

  sigemptyset (&none);
  posix_spawn_file_actions_init (&actions);
  posix_spawn_file_actions_addclosefrom_np (&actions, 3);
  posix_spawnattr_init (&attr);
  posix_spawnattr_setsigmask (&attr, &none);
  posix_spawnattr_setflags (&attr, POSIX_SPAWN_SETSIGMASK);
  r = posix_spawn (&child, SYNC_PROGRAM, &actions, &attr, argv, environ);
  posix_spawnattr_destroy (&attr);
  posix_spawn_file_actions_destroy (&actions);
  if (r != 0) {
    fprintf (stderr, "mloop-ublk: %s: cannot run %s to write its page "
             "cache back before stopping: %s\n", dev, SYNC_PROGRAM,
             strerror (r));
    return;
  }
  while (waitpid (child, &status, 0) == -1 && errno == EINTR)
    ;
  /* sync(1) said why on our stderr. */
  if (!WIFEXITED (status) || WEXITSTATUS (status) != 0)
    fprintf (stderr, "mloop-ublk: %s: the write-back before stopping "
             "failed\n", dev);
}

/* Linux 6.12's ublk learns that its server died when the server's
 * exit cancels the fetch commands it holds on each queue.  A queue whose
 * every tag the server had taken holds no fetch: there only the request
 * timeout (ublk_timeout: server dying, so abort and requeue) notices,
 * after the block layer's default 30 s, and the quiesce that recovery
 * waits for waits for that queue too.  While the server lives, ublk
 * only rearms the timer, so a short one costs a timer, not an error. */
#define REQUEST_TIMEOUT_MS 1000

static void
set_request_timeout (unsigned id)
{
  char path[96];
  snprintf (path, sizeof path, "/sys/block/ublkb%u/queue/io_timeout", id);
  int fd = open (path, O_WRONLY | O_CLOEXEC);
  char text[16];
  int n = snprintf (text, sizeof text, "%d", REQUEST_TIMEOUT_MS);
  if (fd < 0 || write (fd, text, (size_t) n) != n)
    fprintf (stderr, "mloop-ublk: warning: %s: %s; a killed server that "
             "held every request of a queue is noticed only after 30 s\n",
             path, strerror (errno));
  if (fd >= 0)
    close (fd);
}

static const char *
state_name (unsigned state)
{
  switch (state) {
  case UBLK_S_DEV_DEAD: return "dead";
  case UBLK_S_DEV_LIVE: return "live";
  case UBLK_S_DEV_QUIESCED: return "quiesced";
  default: return "unknown";
  }
}

/* --recover ID: opens the control device and checks that ID is a
 * device we may take over, serving IMAGE as opened; its queues and
 * depth into NR_QUEUES and DEPTH.  Dies, the device untouched, if not. */
static void
inspect_device (struct ublk_ctrl *ctrl, unsigned id, const char *image,
                unsigned block_size, uint64_t dev_size, unsigned *nr_queues,
                unsigned *depth)
{
  struct ublk_params p;
  int r = ublk_ctrl_open (ctrl, opt_legacy);
  if (r < 0)
    die ("/dev/ublk-control: %s (is ublk_drv loaded?)", strerror (-r));
  r = ublk_ctrl_get_info (ctrl, id);
  if (r == -ENODEV)
    die ("--recover %u: no ublk device %u", id, id);
  if (r < 0)
    die ("--recover %u: GET_DEV_INFO: %s", id, strerror (-r));
  const struct ublksrv_ctrl_dev_info *info = &ctrl->info;
  if (!(info->flags & UBLK_F_USER_RECOVERY))
    die ("--recover %u: ublk device %u was added without user recovery "
         "(mloop-ublk --recovery); it cannot be taken over", id, id);
  if (info->state == UBLK_S_DEV_LIVE && pid_running (info->ublksrv_pid))
    die ("--recover %u: ublk device %u is live, served by pid %d", id, id,
         info->ublksrv_pid);
  if (info->state == UBLK_S_DEV_DEAD)
    die ("--recover %u: ublk device %u is stopped (state dead), not waiting "
         "for a server", id, id);
  /* QUIESCED, or LIVE with its server gone: the kernel is still
   * quiescing it, and START_USER_RECOVERY waits for that. */
  r = ublk_ctrl_get_params (ctrl, &p);
  if (r < 0)
    die ("--recover %u: GET_PARAMS: %s", id, strerror (-r));
  uint64_t dev_sectors = p.basic.dev_sectors;
  unsigned dev_bs = 1u << p.basic.logical_bs_shift;
  if (dev_sectors != dev_size >> 9 || dev_bs != block_size)
    die ("--recover %u: ublk device %u has %" PRIu64 " bytes in %u-byte "
         "blocks, %s as given %" PRIu64 " in %u-byte blocks", id, id,
         dev_sectors << 9, dev_bs, image, dev_size, block_size);
  if (opt_read_only && !(p.basic.attrs & UBLK_ATTR_READ_ONLY))
    die ("--recover %u: ublk device %u is writable, %s is served read-only",
         id, id, image);
  if (opt_queues && (unsigned) opt_queues != info->nr_hw_queues)
    die ("--recover %u: --queues=%d, but ublk device %u has %u", id,
         opt_queues, id, info->nr_hw_queues);
  if (opt_depth && (unsigned) opt_depth != info->queue_depth)
    die ("--recover %u: --depth=%d, but ublk device %u has %u", id,
         opt_depth, id, info->queue_depth);
  if (info->nr_hw_queues < 1 || info->nr_hw_queues > MAX_QUEUES)
    die ("--recover %u: ublk device %u has %u queues, more than our %d", id,
         id, info->nr_hw_queues, MAX_QUEUES);
  *nr_queues = info->nr_hw_queues;
  *depth = info->queue_depth;
}

/* START_USER_RECOVERY, retried while the kernel says EBUSY (the dead
 * server's /dev/ublkcN not yet released), for RECOVER_WAIT_MS at most.
 * How long it waited into WAITED_MS. */
static int
start_recovery (struct ublk_ctrl *ctrl, unsigned *waited_ms)
{
  struct timespec t0, t;
  clock_gettime (CLOCK_MONOTONIC, &t0);
  for (;;) {
    int r = ublk_ctrl_start_recovery (ctrl);
    clock_gettime (CLOCK_MONOTONIC, &t);
    *waited_ms = (unsigned) ((t.tv_sec - t0.tv_sec) * 1000
                             + (t.tv_nsec - t0.tv_nsec) / 1000000);
    if (r != -EBUSY || *waited_ms >= RECOVER_WAIT_MS)
      return r;
    usleep (20000);
  }
}

/* /dev/ublkcN appears when ADD_DEV returns, but give devtmpfs a moment. */
static int
open_cdev (unsigned id)
{
  char path[64];
  snprintf (path, sizeof path, UBLK_CHAR_PATH, id);
  for (int i = 0; i < 100; i++) {
    int fd = open (path, O_RDWR | O_CLOEXEC);
    if (fd >= 0 || errno != ENOENT)
      return fd;
    usleep (10000);
  }
  return -1;
}

int
main (int argc, char *argv[])
{
  GOptionContext *ctx;
  GError *gerr = NULL;
  char err[512];

  ctx = g_option_context_new ("IMAGE - serve an image file, block device "
                              "or rbd:POOL/IMAGE as a ublk block device");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_set_description (ctx,
    "Example: mloop-ublk --pid-file /run/u.pid --device-file /run/u.dev disk.img\n"
    "         mloop-ublk --delete 0");
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr)) {
    char message[512];

    /* Freed before die() exits: LeakSanitizer counts what the exit
     * handlers cannot reach, and a pointer in a dead register is not. */
    g_strlcpy (message, gerr->message, sizeof message);
    g_error_free (gerr);
    g_option_context_free (ctx);
    die ("%s (see --help)", message);
  }
  g_option_context_free (ctx);
  if (opt_version) {
    printf ("mloop-ublk %s\n", PACKAGE_VERSION);
    return EXIT_SUCCESS;
  }
  check_options (argc);
  if (opt_delete >= 0) {
    if (ublk_delete_device ((unsigned) opt_delete, opt_legacy, err, sizeof err) < 0)
      die ("%s", err);
    return EXIT_SUCCESS;
  }
  const char *image = argv[1];
  bool recover = opt_recover >= 0;
  unsigned nr_queues = (unsigned) opt_queues, depth = (unsigned) opt_depth;

  /* Blocked before any thread exists (an RBD store's librados starts
   * its own as it opens), so every thread inherits the mask and only the
   * sigwait below takes them. */
  sigset_t stop_sigs;
  sigemptyset (&stop_sigs);
  sigaddset (&stop_sigs, SIGTERM);
  sigaddset (&stop_sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, &stop_sigs, NULL);

  struct mloop_engine engine;
  unsigned block_size;
  uint64_t dev_size;
  open_image (&engine, image, &block_size, &dev_size);
  mloop_engine_probe_features (&engine);
  struct ublk_ctrl ctrl;
  unsigned found_state = 0;
  int found_pid = 0;
  if (recover) {
    inspect_device (&ctrl, (unsigned) opt_recover, image, block_size,
                    dev_size, &nr_queues, &depth);
    found_state = ctrl.info.state;
    found_pid = ctrl.info.ublksrv_pid;
  }
  struct mloop_aio_ring aio[MAX_QUEUES];
  depth = open_aio (aio, nr_queues, depth, recover);
  /* Taking over, the dead server's counters go on (counters.h). */
  struct mloop_stats *stats = NULL;
  if (opt_stats_file &&
      !(stats = recover ? ublk_counters_reopen (opt_stats_file)
                        : mloop_stats_create (opt_stats_file)))
    die ("--stats-file %s: %s", opt_stats_file, strerror (errno));


  struct ublk_queue queues[MAX_QUEUES];
  unsigned inited = 0, started = 0, id = 0, waited_ms = 0;
  bool added = false, dev_started = false, device_file = false, serving = false;
  /* --recover: from START_USER_RECOVERY until we serve (the files
   * written).  A failure then leaves the device neither stopped nor
   * deleted: our rings and /dev/ublkcN closing is, to the kernel, one
   * more dead server, and the device waits quiesced for another
   * --recover. */
  bool recovering = false;
  int cfd = -1;
  int r;

  struct ublk_offload *offload = ublk_offload_start (UBLK_HELPERS);
  if (!offload) {
    fail ("starting %d helper threads: %s", UBLK_HELPERS, strerror (errno));
    for (unsigned i = 0; i < nr_queues; i++)
      mloop_aio_ring_destroy (&aio[i]);
    if (recover)
      ublk_ctrl_close (&ctrl);
    goto close_engine;
  }
  r = recover ? 0 : ublk_ctrl_open (&ctrl, opt_legacy);
  if (r < 0) {
    fail ("/dev/ublk-control: %s (is ublk_drv loaded?)", strerror (-r));
    for (unsigned i = 0; i < nr_queues; i++)
      mloop_aio_ring_destroy (&aio[i]);
    goto stop_offload;
  }
  if (recover) {
    id = (unsigned) opt_recover;
    r = start_recovery (&ctrl, &waited_ms);
    if (r == -EBUSY)
      fail ("--recover %u: START_USER_RECOVERY still busy after %d s (its "
            "old server, pid %d, still exiting?)", id, RECOVER_WAIT_MS / 1000,
            ctrl.info.ublksrv_pid);
    else if (r < 0)
      fail ("--recover %u: START_USER_RECOVERY: %s", id, strerror (-r));
    else {
      recovering = true;
      /* Only now: the kernel refuses a second opener, and START resets
       * whom the descriptors may be mapped by. */
      cfd = open_cdev (id);
      if (cfd < 0)
        fail ("/dev/ublkc%u: %s", id, strerror (errno));
    }
  } else if ((r = ublk_ctrl_add (&ctrl, opt_id, nr_queues, depth,
                                 MAX_IO_BYTES, opt_recovery)) < 0) {
    if (r == -EEXIST && opt_id >= 0)
      fail ("--id=%d: ublk device %d exists already (/dev/ublkc%d)", opt_id,
            opt_id, opt_id);
    else
      fail ("/dev/ublk-control: ADD_DEV (%u queues of %u): %s", nr_queues,
            depth, strerror (-r));
  }
  else {
    added = true;
    id = ctrl.info.dev_id;
    cfd = open_cdev (id);
    if (cfd < 0)
      fail ("/dev/ublkc%u: %s", id, strerror (errno));
  }
  /* The queues own the AIO contexts from here, also on failure. */
  for (; inited < nr_queues && !failure[0]; inited++) {
    r = ublk_queue_init (&queues[inited], cfd, &engine, &aio[inited], offload,
                         inited, depth, ctrl.info.max_io_buf_bytes);
    if (r < 0)
      fail ("/dev/ublkc%u: queue %u: %s", id, inited, strerror (-r));
  }
  for (unsigned i = inited; i < nr_queues; i++)
    mloop_aio_ring_destroy (&aio[i]);
  for (unsigned i = 0; i < inited && !failure[0]; i++)
    queues[i].stats = stats;
  if (!failure[0] && !recover) {
    unsigned shift = (unsigned) __builtin_ctz (block_size);
    r = ublk_ctrl_set_params (&ctrl, dev_size, shift, shift > 12 ? shift : 12,
                              opt_read_only,
                              opt_read_only ? 0 : MAX_DISCARD_BYTES);
    if (r < 0)
      fail ("/dev/ublkc%u: SET_PARAMS: %s", id, strerror (-r));
  }
  /* STARTED counts threads that run: teardown joins exactly those. */
  for (; started < inited && !failure[0]; started++) {
    r = ublk_queue_start (&queues[started]);
    if (r < 0) {
      fail ("/dev/ublkc%u: queue %u: %s", id, started, strerror (-r));
      break;
    }
  }
  if (!failure[0] && recover) {
    /* Waits for the fetches as START_DEV does; then the requests held
     * (and those the dead server had, reissued) come to our queues. */
    r = ublk_ctrl_end_recovery (&ctrl);
    if (r < 0)
      fail (UBLK_BLOCK_PATH ": END_USER_RECOVERY: %s", id, strerror (-r));
    else
      dev_started = true;
  } else if (!failure[0]) {
    /* Blocks until every queue has fetched its tags; the disk's
     * partition scan is served meanwhile. */
    r = ublk_ctrl_start (&ctrl);
    if (r < 0)
      fail (UBLK_BLOCK_PATH ": START_DEV: %s", id, strerror (-r));
    else {
      dev_started = true;
      /* The disk keeps it across recoveries: set once, here. */
      set_request_timeout (id);
    }
  }
  char dev[64];
  snprintf (dev, sizeof dev, UBLK_BLOCK_PATH, id);
  if (!failure[0] && opt_device_file) {
    char text[80];
    snprintf (text, sizeof text, "%s\n", dev);
    if (write_whole_file ("--device-file", opt_device_file, text))
      device_file = true;
  }
  if (!failure[0] && opt_pid_file) {
    char text[32];
    snprintf (text, sizeof text, "%d\n", (int) getpid ());
    write_whole_file ("--pid-file", opt_pid_file, text);
  }
  serving = !failure[0];
  if (serving && recovering) {
    recovering = false;
    added = true;               /* ours now: SIGTERM deletes it */
  }
  if (!failure[0]) {
    if (recover)
      fprintf (stderr, "mloop-ublk: recovered %s (found %s, its server pid "
               "%d gone; START_USER_RECOVERY waited %u ms)\n", dev,
               state_name (found_state), found_pid, waited_ms);
    fprintf (stderr, "mloop-ublk: serving %s as %s: %" PRIu64 " bytes, "
             "%u-byte blocks, %u queue%s of %u, %s%s%s\n", image, dev,
             dev_size, block_size, nr_queues, nr_queues > 1 ? "s" : "", depth,
             mloop_engine_info (&engine)->direct ? "direct" : "buffered",
             opt_read_only ? ", read-only" : "",
             opt_recovery || recover ? ", recoverable" : "");
    printf ("%s\n", dev);       /* for whoever reads our stdout */
    fflush (stdout);
    /* A queue is to ublk what a connection is to NBD. */
    MLOOP_STATS_ADD (stats, connections, nr_queues);
    MLOOP_STATS_ADD (stats, connections_total, nr_queues);
    int sig;
    sigwait (&stop_sigs, &sig);
    bool outside = false, queue_failed = false;
    for (unsigned i = 0; i < started; i++) {
      outside |= atomic_load (&queues[i].ended) && !queues[i].err;
      queue_failed |= queues[i].err != 0;
    }
    if (queue_failed && (opt_recovery || recover))
      leave_for_recovery (dev, queues, started);
    if (outside)
      fprintf (stderr, "mloop-ublk: %s was stopped from outside; "
               "deleting it\n", dev);
    else
      flush_device (dev);
  }

  /* Teardown.  STOP_DEV also on failure after ADD_DEV: harmless on a
   * device never started, and it aborts the queues' fetches. */
  if (added && (dev_started || started)) {
    r = ublk_ctrl_stop (&ctrl);
    if (r < 0 && r != -ENODEV)
      fail ("%s: STOP_DEV: %s", dev, strerror (-r));
  }
  for (unsigned i = 0; i < started; i++)
    ublk_queue_join (&queues[i]);
  if (serving)
    MLOOP_STATS_SUB (stats, connections, nr_queues);
  for (unsigned i = 0; i < started; i++)
    if (queues[i].err)
      fail ("%s: queue %u: %s", dev, i, strerror (-queues[i].err));
stop_offload:
  /* After the queues stopped submitting, before their memory goes: a
   * helper may still hold one of their jobs, and a store with threads of
   * its own (RBD) may still post to their ports. */
  ublk_offload_stop (offload);
  mloop_engine_quiesce (&engine);
  for (unsigned i = 0; i < inited; i++)
    ublk_queue_free (&queues[i]);
  if (cfd >= 0)
    close (cfd);
  if (added) {
    /* DEL_DEV waits for the character device to be closed: after the
     * queues, never before.  ENODEV: someone ran --delete meanwhile. */
    r = ublk_ctrl_del (&ctrl, DEL_TIMEOUT_MS);
    if (r < 0 && r != -ENODEV)
      fail ("/dev/ublkc%u: DEL_DEV: %s", id, strerror (-r));
  }
  ublk_ctrl_close (&ctrl);
  /* A start that failed leaves nothing behind (the pid file, written
   * last, cannot exist then); after a clean stop the files are the
   * starter's. */
  if (failure[0] && device_file && !serving)
    unlink (opt_device_file);
close_engine:
  if (stats)
    mloop_stats_close (stats);
  mloop_engine_close (&engine);
  if (failure[0]) {
    /* A recovery that failed before every queue fetched cannot be
     * started again on Linux 6.12 (START_USER_RECOVERY says EINVAL):
     * then only --delete helps.  Past END_USER_RECOVERY it can. */
    fprintf (stderr, "mloop-ublk: %s%s\n", failure, !recovering ? ""
             : dev_started ? "; the device is left quiesced for another "
             "--recover" : "; the device is left quiesced, but Linux 6.12 may "
             "refuse another --recover of it (then: --delete)");
    return EXIT_FAILURE;
  }
  return EXIT_SUCCESS;
}
