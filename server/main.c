/* mloop-server — a native event-driven NBD server on mloop's IO engine.
 *
 * This file parses the command line (glib's GOption), opens the image,
 * listens, and runs the accept loop.  Each accepted connection negotiates
 * on a short-lived thread of its own (handshake.c, blocking with
 * timeouts, so a slow or hostile client holds up nobody) and is then
 * handed to an event-loop worker (worker.c), round robin.
 *
 * Signals: SIGTERM and SIGINT are blocked in every thread and read from a
 * signalfd by the accept loop, which then stops accepting and stops the
 * workers (they answer what they already received, finish what is in
 * flight, and close), removes the socket and the pid file, and exits 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include <glib.h>

#include "engine.h"
#include "handshake.h"
#include "listener.h"
#include "memory_pressure.h"
#include "nbd_proto.h"
#include "stats.h"
#include "worker.h"

/* The largest READ/WRITE accepted, advertised as the maximum block size. */
#define MAX_REQUEST (32u << 20)
#define HANDSHAKE_TIMEOUT_S 30

static gchar *opt_listen;
static gint opt_threads = MLOOP_THREADS_DEFAULT;
static gint opt_queue_depth = 1024;
static gboolean opt_read_only;
static gchar *opt_direct;
static gchar *opt_discard;
static gchar *opt_pid_file;
static gchar *opt_stats_file;
static gboolean opt_mlock;
static gboolean opt_version;

static GOptionEntry entries[] = {
  { "listen", 'l', 0, G_OPTION_ARG_STRING, &opt_listen,
    "Where to listen: unix:PATH or tcp:HOST:PORT (required)", "ADDR" },
  { "threads", 't', 0, G_OPTION_ARG_INT, &opt_threads,
    "Event-loop workers, 1..64 (default 4)", "N" },
  { "queue-depth", 'q', 0, G_OPTION_ARG_INT, &opt_queue_depth,
    "AIO requests in flight per worker (default 1024)", "N" },
  { "read-only", 'r', 0, G_OPTION_ARG_NONE, &opt_read_only,
    "Serve read-only", NULL },
  { "direct", 0, 0, G_OPTION_ARG_STRING, &opt_direct,
    "O_DIRECT: auto (default), on or off", "MODE" },
  { "discard", 0, 0, G_OPTION_ARG_STRING, &opt_discard,
    "Honour TRIM: on (default) or off", "on|off" },
  { "pid-file", 'P', 0, G_OPTION_ARG_FILENAME, &opt_pid_file,
    "Write the pid here once listening", "FILE" },
  { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &opt_stats_file,
    "Keep request counters in this file (read by mloop status)", "FILE" },
  { "mlock", 0, 0, G_OPTION_ARG_NONE, &opt_mlock,
    "Lock the server's memory (mlockall): never paged out", NULL },
  { "version", 'V', 0, G_OPTION_ARG_NONE, &opt_version,
    "Print the version and exit", NULL },
  { NULL }
};

static struct mloop_engine engine;
static struct export_info export;
static struct worker **workers;
static unsigned nr_workers;
static unsigned next_worker;
static pthread_mutex_t next_worker_lock = PTHREAD_MUTEX_INITIALIZER;

static void G_GNUC_NORETURN
die (const char *fmt, ...)
{
  va_list ap;

  fputs ("mloop-server: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (EXIT_FAILURE);
}

/* A connection's own thread: negotiate, then hand it to a worker. */
static void *
handshake_thread (void *arg)
{
  int fd = (int) (intptr_t) arg;
  struct timeval tv = { HANDSHAKE_TIMEOUT_S, 0 };
  struct worker *w;

  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (mloop_handshake (fd, &export) == -1) {
    close (fd);
    return NULL;
  }
  tv.tv_sec = 0;
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  pthread_mutex_lock (&next_worker_lock);
  w = workers[next_worker++ % nr_workers];
  pthread_mutex_unlock (&next_worker_lock);
  worker_add_connection (w, fd);
  return NULL;
}

static void
accept_one (int listen_fd)
{
  pthread_attr_t attr;
  pthread_t t;
  int fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC);

  if (fd == -1)
    return;                     /* EAGAIN, ECONNABORTED, EMFILE: go on */
  pthread_attr_init (&attr);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create (&t, &attr, handshake_thread, (void *) (intptr_t) fd))
    close (fd);
  pthread_attr_destroy (&attr);
}

static uint16_t
transmission_flags (bool discard)
{
  uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_CAN_MULTI_CONN;

  if (opt_read_only)
    return f | NBD_FLAG_READ_ONLY | NBD_FLAG_SEND_FLUSH;
  f |= NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA |
    NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
  if (discard)
    f |= NBD_FLAG_SEND_TRIM;
  return f;
}

static bool
parse_on_off (const char *name, const char *value)
{
  if (value == NULL || g_ascii_strcasecmp (value, "on") == 0)
    return true;
  if (g_ascii_strcasecmp (value, "off") == 0)
    return false;
  die ("--%s=%s: must be on or off", name, value);
}

static void
write_pid_file (void)
{
  FILE *f;

  if (opt_pid_file == NULL)
    return;
  f = fopen (opt_pid_file, "w");
  if (f == NULL || fprintf (f, "%d\n", (int) getpid ()) < 0 || fclose (f))
    die ("--pid-file %s: %s", opt_pid_file, strerror (errno));
}

int
main (int argc, char *argv[])
{
  GOptionContext *ctx;
  GError *gerr = NULL;
  struct mloop_engine_config cfg;
  struct listener listener;
  struct worker_options wopts;
  sigset_t sigs;
  int sfd;
  bool discard;
  char err[512];
  unsigned i;

  ctx = g_option_context_new ("IMAGE - serve an image file or block device "
                              "over NBD");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_set_description (ctx,
    "Example: mloop-server --listen unix:/run/mloop.sock disk.img\n"
    "See mloop-server(8).");
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr))
    die ("%s (see --help)", gerr->message);
  g_option_context_free (ctx);
  if (opt_version) {
    printf ("mloop-server %s\n", PACKAGE_VERSION);
    return EXIT_SUCCESS;
  }
  if (argc != 2)
    die ("expected one IMAGE argument (see --help)");
  if (opt_listen == NULL)
    die ("--listen unix:PATH or tcp:HOST:PORT is required");
  if (opt_queue_depth < 1 || opt_queue_depth > MLOOP_QUEUE_DEPTH_MAX)
    die ("--queue-depth=%d: must be between 1 and %d", opt_queue_depth,
         MLOOP_QUEUE_DEPTH_MAX);
  discard = parse_on_off ("discard", opt_discard);
  if (opt_mlock && (errno = -mloop_lock_memory ()) != 0)
    die ("--mlock: mlockall: %s", strerror (errno));
  /* The workers mark themselves; asking here first tells us once. */
  if (!mloop_io_flusher_thread ())
    fprintf (stderr, "mloop-server: warning: PR_SET_IO_FLUSHER not "
             "permitted (needs CAP_SYS_RESOURCE): serving a local device "
             "under memory pressure can deadlock\n");

  mloop_engine_config_init (&cfg);
  cfg.path = argv[1];
  cfg.threads = opt_threads < 0 ? 0 : (unsigned) opt_threads;
  cfg.want_write = !opt_read_only;
  if (opt_direct && mloop_direct_mode_parse (opt_direct, &cfg.direct) == -1)
    die ("--direct=%s: must be auto, on or off", opt_direct);
  if (mloop_engine_open (&engine, &cfg, err, sizeof err) == -1)
    die ("%s", err);
  if (engine.backing.direct_fallback)
    fprintf (stderr, "mloop-server: warning: %s: O_DIRECT not supported "
             "here, using buffered IO\n", argv[1]);
  if (!engine.backing.writable)
    opt_read_only = TRUE;       /* e.g. a file on a read-only mount */
  mloop_engine_probe_features (&engine);

  export.size = engine.backing.size;
  export.transmission_flags = transmission_flags (discard);
  export.min_block = engine.backing.logical_block_size;
  export.preferred_block = export.min_block > 4096 ? export.min_block : 4096;
  export.max_block = MAX_REQUEST;

  /* Block the signals before any thread exists, so every thread inherits
   * the mask and only the signalfd sees them.
   */
  sigemptyset (&sigs);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, &sigs, NULL);
  signal (SIGPIPE, SIG_IGN);
  sfd = signalfd (-1, &sigs, SFD_CLOEXEC);

  wopts = (struct worker_options) {
    .engine = &engine, .read_only = opt_read_only, .discard = discard,
    .max_request = MAX_REQUEST, .ring_depth = (unsigned) opt_queue_depth,
  };
  if (opt_stats_file &&
      (wopts.stats = mloop_stats_create (opt_stats_file)) == NULL)
    die ("--stats-file %s: %s", opt_stats_file, strerror (errno));
  nr_workers = engine.threads;
  workers = calloc (nr_workers, sizeof *workers);
  for (i = 0; i < nr_workers; i++) {
    workers[i] = worker_start (&wopts, err, sizeof err);
    if (workers[i] == NULL)
      die ("%s", err);
  }
  if (listener_open (&listener, opt_listen, err, sizeof err) == -1)
    die ("%s", err);
  write_pid_file ();

  for (;;) {
    struct pollfd p[2] = { { listener.fd, POLLIN, 0 }, { sfd, POLLIN, 0 } };

    if (poll (p, 2, -1) == -1 && errno != EINTR)
      break;
    if (p[1].revents)
      break;                    /* SIGTERM or SIGINT */
    if (p[0].revents & POLLIN)
      accept_one (listener.fd);
  }

  listener_close (&listener);
  for (i = 0; i < nr_workers; i++)
    worker_stop (workers[i]);
  free (workers);
  if (opt_pid_file)
    unlink (opt_pid_file);
  mloop_engine_close (&engine);
  close (sfd);
  return EXIT_SUCCESS;
}
