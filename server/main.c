/* mloop-server — a native event-driven NBD server on mloop's IO engine.
 *
 * This file parses the command line (glib's GOption), opens the image,
 * listens, and runs the accept loop.  Each accepted connection negotiates
 * on a short-lived thread of its own (handshake.c, blocking, so a slow or
 * hostile client holds up nobody) and is then handed to an event-loop
 * worker (worker.c), round robin.  Until then a connection costs its
 * socket, that thread with its small stack and a few bytes of bookkeeping,
 * nothing else: the accept loop drops it at its deadline, and drops the
 * oldest when too many are negotiating at once (pending.c).
 *
 * Signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread and
 * read from a signalfd by the accept loop.  SIGHUP re-reads the image's
 * size (it grew or shrank: `mloop resize`): new handshakes announce it
 * and every request checked afterwards is checked against it; existing
 * connections go on (NBD has no way to tell a client, and the kernel
 * client only checks its own size).  SIGTERM and SIGINT stop accepting, drops the
 * connections still negotiating, stops the workers (they answer what they
 * already received, finish what is in flight, send the replies their
 * clients will read within --drain-timeout, and close), removes the
 * socket and the pid file, and exits 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>

#include <glib.h>

#include "admission.h"
#include "dispatch.h"
#include "align.h"
#include "budget.h"
#include "aio_ring.h"
#include "engine.h"
#include "handshake.h"
#include "listener.h"
#include "log_limit.h"
#include "peer.h"
#include "memory_pressure.h"
#include "nbd_proto.h"
#include "offload.h"
#include "pending.h"
#include "rbd_options.h"
#include "served_image.h"
#include "splice_out.h"
#include "stats.h"
#include "tls.h"
#include "trace.h"
#include "worker.h"

#define DRAIN_TIMEOUT_DEFAULT 5
#define DRAIN_TIMEOUT_MAX 3600
#define HANDSHAKE_TIMEOUT_MAX (24 * 3600)
#define MAX_HANDSHAKES_MAX 1000000
/* A handshake needs a few KiB of stack (handshake.c's largest frame is
 * one option payload and the export name of a meta context selection,
 * under 10 KiB).  The default, RLIMIT_STACK
 * (usually 8 MiB), would make a thousand idle connections reserve 8 GiB
 * of address space, and all of it locked under --mlock.
 */
#define HANDSHAKE_STACK (64 * 1024)
/* With --tls, the TLS handshake runs on that thread too: GnuTLS, nettle
 * and GMP put buffers and bignum temporaries on the stack (GMP up to
 * 32 KiB at a time), more with larger keys.  Address space reserved,
 * not memory used.
 */
#define HANDSHAKE_STACK_TLS (512 * 1024)
/* accept() failing for want of descriptors (EMFILE, ENFILE) leaves the
 * connection queued and the listener readable: pause instead of spinning.
 */
#define ACCEPT_BACKOFF_MS 100
#define MAX_CONNECTIONS_MAX 1000000
/* TCP keepalive (--keepalive IDLE:INTERVAL:COUNT): a client gone without
 * a FIN (powered off, cable pulled, a partition) is dropped after
 * IDLE + INTERVAL * COUNT seconds, 60 by default: long enough to ride
 * out a short network hiccup, short enough that a dead peer's
 * connection (its buffers, its place under the caps) is given back
 * within a minute, and that a client reconnecting after a partition
 * finds the server has let the old connection go.  The same bound is
 * the TCP user timeout, so data left unacknowledged that long ends the
 * connection too.  Linux's defaults (2 hours idle) suit neither.
 */
#define KEEPALIVE_DEFAULT "30:10:3"
#define KEEPALIVE_MAX_S 32767   /* TCP_KEEPIDLE and TCP_KEEPINTVL's limit */
#define KEEPALIVE_COUNT_MAX 127
/* Event loops (--threads): each owns its connections and AIO context. */
#define WORKERS_DEFAULT 4
#define WORKERS_MAX     64
/* AIO requests in flight per event loop (--queue-depth). */
#define WORKER_QUEUE_DEPTH_DEFAULT 1024

static gchar *opt_listen;
static gint opt_threads = WORKERS_DEFAULT;
static gint opt_queue_depth = WORKER_QUEUE_DEPTH_DEFAULT;
static gchar *opt_export_name;
static gint opt_handshake_timeout = 30;
static gint opt_max_handshakes = 1024;
static gboolean opt_read_only;
static gchar *opt_direct;
static gchar *opt_discard;
static gchar *opt_splice;
static gchar *opt_pid_file;
static gchar *opt_ceph_conf;
static gchar *opt_ceph_id;
static gboolean opt_shared;
static gchar *opt_lock_record;
static gint opt_io_timeout;
static gchar *opt_stats_file;
static gchar *opt_trace;
static gboolean opt_mlock;
static gboolean opt_version;
static gchar *opt_buffer_limit;
static gchar *opt_offset;
static gchar *opt_sizelimit;
static gchar *opt_overlay;
static gboolean opt_overlay_adopt_base;
static gboolean opt_overlay_must_exist;
static gchar *opt_conn_buffer_limit;
static gint opt_helper_threads = OFFLOAD_THREADS_DEFAULT;
static gint opt_drain_timeout = DRAIN_TIMEOUT_DEFAULT;
static gint opt_max_connections;
static gint opt_max_per_client;
static gchar *opt_keepalive;
static gchar *opt_tls;
static gchar *opt_tls_psk;
static gchar *opt_tls_certificates;
static gboolean opt_tls_verify_peer;
static struct {
  bool on;
  int idle, interval, count;
} keepalive;

static GOptionEntry entries[] = {
  { "listen", 'l', 0, G_OPTION_ARG_STRING, &opt_listen,
    "Where to listen: unix:PATH or tcp:HOST:PORT (required)", "ADDR" },
  { "threads", 't', 0, G_OPTION_ARG_INT, &opt_threads,
    "Event-loop workers, 1..64 (default 4)", "N" },
  { "queue-depth", 'q', 0, G_OPTION_ARG_INT, &opt_queue_depth,
    "Most AIO requests in flight per worker; its context starts small and "
    "grows to this (default 1024)", "N" },
  { "export-name", 'e', 0, G_OPTION_ARG_STRING, &opt_export_name,
    "Serve the image under this name only (default: any name)", "NAME" },
  { "handshake-timeout", 0, 0, G_OPTION_ARG_INT, &opt_handshake_timeout,
    "Drop a client still negotiating after this long (default 30)",
    "SECONDS" },
  { "max-handshakes", 0, 0, G_OPTION_ARG_INT, &opt_max_handshakes,
    "Connections negotiating at once; beyond, the oldest is dropped "
    "(default 1024)", "N" },
  { "max-connections", 0, 0, G_OPTION_ARG_INT, &opt_max_connections,
    "Connections open at once (negotiating or served); beyond, new ones "
    "are closed at once (default 0: no cap)", "N" },
  { "max-connections-per-client", 0, 0, G_OPTION_ARG_INT,
    &opt_max_per_client,
    "Connections open at once from one TCP client address (default 0: "
    "no cap)", "N" },
  { "keepalive", 0, 0, G_OPTION_ARG_STRING, &opt_keepalive,
    "TCP keepalive IDLE:INTERVAL:COUNT in seconds, or off (default "
    KEEPALIVE_DEFAULT ")", "SPEC" },
  { "tls", 0, 0, G_OPTION_ARG_STRING, &opt_tls,
    "TLS: off (default), on (offered) or require", "MODE" },
  { "tls-psk", 0, 0, G_OPTION_ARG_FILENAME, &opt_tls_psk,
    "TLS with pre-shared keys from FILE (USERNAME:HEXKEY lines)", "FILE" },
  { "tls-certificates", 0, 0, G_OPTION_ARG_FILENAME, &opt_tls_certificates,
    "TLS with the X.509 certificates in DIR (ca-cert.pem, server-cert.pem, "
    "server-key.pem, ca-crl.pem)", "DIR" },
  { "tls-verify-peer", 0, 0, G_OPTION_ARG_NONE, &opt_tls_verify_peer,
    "Require a client certificate signed by DIR/ca-cert.pem", NULL },
  { "read-only", 'r', 0, G_OPTION_ARG_NONE, &opt_read_only,
    "Serve read-only", NULL },
  { "direct", 0, 0, G_OPTION_ARG_STRING, &opt_direct,
    "O_DIRECT: auto (default), on or off", "MODE" },
  { "discard", 0, 0, G_OPTION_ARG_STRING, &opt_discard,
    "Honour TRIM: on (default) or off", "on|off" },
  { "splice", 0, 0, G_OPTION_ARG_STRING, &opt_splice,
    "Send large READ data to Unix-socket clients by page reference: "
    "off (default) or on (for the kernel's NBD client)", "on|off" },
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
  { "overlay-must-exist", 0, 0, G_OPTION_ARG_NONE, &opt_overlay_must_exist,
    "Refuse to start when there is no overlay: a device's restarted "
    "server, whose overlay must not be made anew", NULL },
  MLOOP_RBD_SERVER_OPTION_ENTRIES (opt_ceph_conf, opt_ceph_id, opt_shared,
                                   opt_lock_record, opt_io_timeout),
  { "pid-file", 'P', 0, G_OPTION_ARG_FILENAME, &opt_pid_file,
    "Write the pid here once listening", "FILE" },
  { "stats-file", 0, 0, G_OPTION_ARG_FILENAME, &opt_stats_file,
    "Keep request counters in this file (read by mloop status)", "FILE" },
  { "buffer-limit", 0, 0, G_OPTION_ARG_STRING, &opt_buffer_limit,
    "Request buffers the whole server may hold (default 1G)", "SIZE" },
  { "connection-buffer-limit", 0, 0, G_OPTION_ARG_STRING,
    &opt_conn_buffer_limit,
    "Request buffers one connection may hold (default 256M)", "SIZE" },
  { "helper-threads", 0, 0, G_OPTION_ARG_INT, &opt_helper_threads,
    "Threads for trim, zero and unaligned IO, 1..64 (default 4)", "N" },
  { "drain-timeout", 0, 0, G_OPTION_ARG_INT, &opt_drain_timeout,
    "On SIGTERM, drop replies still unsent after this long (default 5)",
    "SECONDS" },
  { "trace", 0, 0, G_OPTION_ARG_FILENAME, &opt_trace,
    "Append a line per request event to this file (default: "
    "$MLOOP_TRACE, else none)", "FILE" },
  { "mlock", 0, 0, G_OPTION_ARG_NONE, &opt_mlock,
    "Lock the server's memory (mlockall): never paged out", NULL },
  { "version", 'V', 0, G_OPTION_ARG_NONE, &opt_version,
    "Print the version and exit", NULL },
  G_OPTION_ENTRY_NULL
};

static struct served_image image;
static struct export_info export;       /* the image's, with name and TLS */
static enum handshake_tls tls_mode;      /* --tls */
static int (*start_tls) (int fd, struct transport *t);

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

/* The store's notices (engine.h) and the warnings of opening the image:
 * a state that changed, once, so written directly rather than under the
 * bound on repeated lines.
 */
static void
say_notice (const char *line)
{
  fprintf (stderr, "mloop-server: %s\n", line);
}

/* A connection's own thread: negotiate, then hand it to a worker.  The
 * accept loop may shut the socket down under us (deadline, too many
 * pending, exit): the handshake then fails, or pending_leave says no.
 */
static void *
handshake_thread (void *arg)
{
  struct pending *p = arg;
  int fd = pending_fd (p);
  /* The size as of this handshake: a SIGHUP may change it meanwhile. */
  struct export_info x = export;
  struct session session;
  bool ok;

  x.size = mloop_engine_size (&image.engine);
  ok = mloop_handshake (fd, &x, &session) == 0;
  if (!pending_leave (p) && ok) {
    transport_close (&session.transport);
    ok = false;
  }
  if (ok)
    served_image_add_connection (&image, fd, &session);
  else
    admission_close (fd);
  pending_end ();             /* last: the workers may stop after this */
  return NULL;
}

/* Reads one signal: SIGHUP re-reads the image's size and returns true;
 * SIGTERM and SIGINT return false (stop).
 */
static bool
on_signal (int sfd)
{
  struct signalfd_siginfo si;
  char err[512];
  int r;

  if (read (sfd, &si, sizeof si) != (ssize_t) sizeof si)
    return errno == EINTR || errno == EAGAIN;
  if (si.ssi_signo != SIGHUP)
    return false;
  r = mloop_engine_reprobe_size (&image.engine, err, sizeof err);
  if (r < 0)
    fprintf (stderr, "mloop-server: SIGHUP: %s; still serving %" PRIu64
             " bytes\n", err, mloop_engine_size (&image.engine));
  else
    fprintf (stderr, "mloop-server: SIGHUP: serving %" PRIu64 " bytes\n",
             mloop_engine_size (&image.engine));
  return true;
}

/* Remote clients: replies go out at once (no Nagle delay behind a
 * previous unacknowledged reply), and a peer that vanished without a FIN
 * (powered off, cable pulled) is noticed by keepalive instead of holding
 * its connection forever.
 */
static void
tune_tcp (int fd)
{
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  int one = 1;
  unsigned user_timeout_ms;

  if (getsockname (fd, (struct sockaddr *) &ss, &len) == -1 ||
      (ss.ss_family != AF_INET && ss.ss_family != AF_INET6))
    return;
  setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!keepalive.on)
    return;
  user_timeout_ms = (unsigned) (keepalive.idle +
                                keepalive.interval * keepalive.count) * 1000;
  setsockopt (fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt (fd, IPPROTO_TCP, TCP_KEEPIDLE, &keepalive.idle, sizeof (int));
  setsockopt (fd, IPPROTO_TCP, TCP_KEEPINTVL, &keepalive.interval,
              sizeof (int));
  setsockopt (fd, IPPROTO_TCP, TCP_KEEPCNT, &keepalive.count, sizeof (int));
  setsockopt (fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
              sizeof user_timeout_ms);
}

/* --keepalive off, or IDLE:INTERVAL:COUNT. */
static void
parse_keepalive (const char *spec)
{
  char extra;

  if (strcmp (spec, "off") == 0) {
    keepalive.on = false;
    return;
  }
  if (sscanf (spec, "%d:%d:%d%c", &keepalive.idle, &keepalive.interval,
              &keepalive.count, &extra) != 3 ||
      keepalive.idle < 1 || keepalive.idle > KEEPALIVE_MAX_S ||
      keepalive.interval < 1 || keepalive.interval > KEEPALIVE_MAX_S ||
      keepalive.count < 1 || keepalive.count > KEEPALIVE_COUNT_MAX)
    die ("--keepalive=%s: must be off or IDLE:INTERVAL:COUNT (seconds "
         "1..%d, count 1..%d)", spec, KEEPALIVE_MAX_S, KEEPALIVE_COUNT_MAX);
  keepalive.on = true;
}

/* Returns false when accept failed for want of descriptors. */
static bool
accept_one (int listen_fd, const pthread_attr_t *attr)
{
  struct pending *p;
  pthread_t t;
  int fd = accept4 (listen_fd, NULL, NULL, SOCK_CLOEXEC);

  if (fd == -1)
    return errno != EMFILE && errno != ENFILE;  /* EAGAIN, ECONNABORTED: go on */
  if (!admission_admit (fd)) {
    close (fd);
    return true;
  }
  tune_tcp (fd);
  p = pending_begin (fd);
  if (p == NULL) {
    admission_close (fd);
    return true;
  }
  if (pthread_create (&t, attr, handshake_thread, p)) {
    pending_abandon (p);
    admission_close (fd);
  }
  return true;
}

/* Idle connections cost a descriptor each: allow as many as we may.
 * Quiet unless it fails.
 */
static void
raise_nofile_limit (void)
{
  struct rlimit rl;

  if (getrlimit (RLIMIT_NOFILE, &rl) == -1 || rl.rlim_cur == rl.rlim_max)
    return;
  rl.rlim_cur = rl.rlim_max;
  if (setrlimit (RLIMIT_NOFILE, &rl) == -1)
    fprintf (stderr, "mloop-server: warning: raising the open files limit "
             "to %llu: %s\n", (unsigned long long) rl.rlim_max,
             strerror (errno));
}

/* --tls and its credentials: checked together, loaded before anything
 * is served, so a mistake is one line at startup.
 */
static void
setup_tls (void)
{
  struct tls_options o = {
    .psk_file = opt_tls_psk, .cert_dir = opt_tls_certificates,
    .verify_peer = opt_tls_verify_peer,
    .peer_address = peer_address, .log_limited = log_limited,
  };
  char err[512];

  tls_mode = HANDSHAKE_TLS_OFF;
  if (opt_tls == NULL || strcmp (opt_tls, "off") == 0)
    ;
  else if (strcmp (opt_tls, "on") == 0)
    tls_mode = HANDSHAKE_TLS_ON;
  else if (strcmp (opt_tls, "require") == 0)
    tls_mode = HANDSHAKE_TLS_REQUIRE;
  else
    die ("--tls=%s: must be off, on or require", opt_tls);
  if (tls_mode == HANDSHAKE_TLS_OFF) {
    if (opt_tls_psk || opt_tls_certificates || opt_tls_verify_peer)
      die ("--tls-psk, --tls-certificates and --tls-verify-peer need "
           "--tls on or require");
    return;
  }
  if (opt_tls_psk && opt_tls_certificates)
    die ("--tls-psk and --tls-certificates exclude each other");
  if (!opt_tls_psk && !opt_tls_certificates)
    die ("--tls=%s needs --tls-psk FILE or --tls-certificates DIR", opt_tls);
  if (opt_tls_verify_peer && !opt_tls_certificates)
    die ("--tls-verify-peer needs --tls-certificates DIR");
  if (tls_load (&o, &start_tls, err, sizeof err) == -1)
    die ("%s", err);
  if (tls_mode == HANDSHAKE_TLS_ON)
    fprintf (stderr, "mloop-server: warning: --tls on serves plaintext "
             "clients too (nothing they send or read is encrypted); "
             "--tls require refuses them\n");
}

/* --NAME=VALUE, on when not given. */
static bool
parse_on_off (const char *name, const char *value)
{
  bool on = true;

  if (value && mloop_on_off_parse (value, &on) < 0)
    die ("--%s=%s: must be on or off", name, value);
  return on;
}

/* Parses a size such as 4096, 64K, 256M or 1G (binary units) for
 * --NAME; at least MIN.
 */
static uint64_t
parse_size (const char *name, const char *value, uint64_t dflt, uint64_t min)
{
  uint64_t n;

  if (value == NULL)
    return dflt;
  if (mloop_size_parse (value, &n) < 0 || n < min)
    die ("--%s=%s: must be a size of at least %" PRIu64 " bytes "
         "(suffixes K, M, G, T)", name, value, min);
  return n;
}

/* The file appears whole (glib writes it aside and renames it into
 * place): its existence means ready, so a reader must never find it
 * empty.  Returns false with the reason in ERR.
 */
static bool
write_pid_file (char *err, size_t errlen)
{
  g_autoptr (GError) gerr = NULL;
  char line[32];

  if (opt_pid_file == NULL)
    return true;
  snprintf (line, sizeof line, "%d\n", (int) getpid ());
  if (g_file_set_contents_full (opt_pid_file, line, -1,
                                G_FILE_SET_CONTENTS_CONSISTENT, 0644, &gerr))
    return true;
  snprintf (err, errlen, "--pid-file %s", gerr->message);
  return false;
}

/* Request buffers up to MLOOP_KEEP_BUFFER come from malloc and are freed
 * after each reply.  glibc would serve a 1 MiB one with a fresh mapping
 * until its adaptive threshold rises, and hands the top of a thread's
 * heap back to the kernel whenever it passes the trim threshold: either
 * way the next request's buffer is faulted in and zeroed again, and the
 * unmapping costs a TLB shootdown on every CPU.  Measured in the VM on
 * 4 x 1 MiB readers, page zeroing took more of the server's CPU than
 * copying the data (docs/benchmarks.md, kernel path).  So buffers up to
 * that size always come from the heap and freed ones stay for reuse, up
 * to MALLOC_TRIM_KEEP free at the top of each heap: a few requests'
 * worth, so a steady stream reuses its pages, while what a burst of
 * clients leaves goes back at once.  (glibc's malloc_trim releases the
 * free pages inside every heap but the top of a thread's heap only
 * through this threshold: at 64 MiB, 500 clients gone left 78 MiB
 * resident; at 4 MiB, 8 MiB.)  A worker trims when it idles
 * (server/worker.c).  Larger buffers are private mappings of their own
 * (mloop_alloc_aligned), returned when freed.
 */
#define MALLOC_TRIM_KEEP (4u << 20)

static void
keep_request_buffers (void)
{
  mallopt (M_MMAP_THRESHOLD, 2 * MLOOP_KEEP_BUFFER);
  mallopt (M_TRIM_THRESHOLD, MALLOC_TRIM_KEEP);
}

int
main (int argc, char *argv[])
{
  GOptionContext *ctx;
  GError *gerr = NULL;
  struct mloop_engine_config cfg;
  struct listener listener;
  struct worker_options wopts;
  struct budget budget;
  struct offload *offload;
  pthread_attr_t attr;
  sigset_t sigs;
  int sfd, backoff = 0;
  bool discard, splice;
  char err[512];

  keep_request_buffers ();
  ctx = g_option_context_new ("IMAGE - serve an image file, block device "
                              "or rbd:POOL/IMAGE[@SNAP] over NBD");
  g_option_context_add_main_entries (ctx, entries, NULL);
  g_option_context_set_description (ctx,
    "Example: mloop-server --listen unix:/run/mloop.sock disk.img\n"
    "See mloop-server(8).");
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
    printf ("mloop-server %s\n", PACKAGE_VERSION);
    return EXIT_SUCCESS;
  }
  if (argc != 2)
    die ("expected one IMAGE argument (see --help)");
  if (opt_listen == NULL)
    die ("--listen unix:PATH or tcp:HOST:PORT is required");
  if (opt_threads < 1 || opt_threads > WORKERS_MAX)
    die ("--threads=%d: must be between 1 and %d", opt_threads, WORKERS_MAX);
  if (opt_queue_depth < 1 || opt_queue_depth > MLOOP_QUEUE_DEPTH_MAX)
    die ("--queue-depth=%d: must be between 1 and %d", opt_queue_depth,
         MLOOP_QUEUE_DEPTH_MAX);
  if (opt_handshake_timeout < 1 || opt_handshake_timeout > HANDSHAKE_TIMEOUT_MAX)
    die ("--handshake-timeout=%d: must be between 1 and %d seconds",
         opt_handshake_timeout, HANDSHAKE_TIMEOUT_MAX);
  if (opt_max_handshakes < 1 || opt_max_handshakes > MAX_HANDSHAKES_MAX)
    die ("--max-handshakes=%d: must be between 1 and %d", opt_max_handshakes,
         MAX_HANDSHAKES_MAX);
  if (opt_export_name &&
      (strlen (opt_export_name) > NBD_MAX_STRING ||
       !g_utf8_validate (opt_export_name, -1, NULL)))
    die ("--export-name: must be UTF-8, at most %d bytes", NBD_MAX_STRING);
  if (opt_helper_threads < 1 || opt_helper_threads > OFFLOAD_THREADS_MAX)
    die ("--helper-threads=%d: must be between 1 and %d", opt_helper_threads,
         OFFLOAD_THREADS_MAX);
  if (opt_drain_timeout < 0 || opt_drain_timeout > DRAIN_TIMEOUT_MAX)
    die ("--drain-timeout=%d: must be between 0 and %d seconds",
         opt_drain_timeout, DRAIN_TIMEOUT_MAX);
  if (opt_io_timeout < 0)
    die ("--io-timeout=%d: must be 0 (wait) or more seconds", opt_io_timeout);
  if (opt_max_connections < 0 || opt_max_connections > MAX_CONNECTIONS_MAX)
    die ("--max-connections=%d: must be between 0 (no cap) and %d",
         opt_max_connections, MAX_CONNECTIONS_MAX);
  if (opt_max_per_client < 0 || opt_max_per_client > MAX_CONNECTIONS_MAX)
    die ("--max-connections-per-client=%d: must be between 0 (no cap) and "
         "%d", opt_max_per_client, MAX_CONNECTIONS_MAX);
  parse_keepalive (opt_keepalive ? opt_keepalive : KEEPALIVE_DEFAULT);
  admission_init ((unsigned) opt_max_connections,
                  (unsigned) opt_max_per_client);
  budget_init (&budget,
               parse_size ("buffer-limit", opt_buffer_limit,
                           BUDGET_SERVER_DEFAULT, MLOOP_KEEP_BUFFER),
               parse_size ("connection-buffer-limit", opt_conn_buffer_limit,
                           BUDGET_CONN_DEFAULT, MLOOP_KEEP_BUFFER));
  discard = parse_on_off ("discard", opt_discard);
  splice = opt_splice && parse_on_off ("splice", opt_splice);
  setup_tls ();
  raise_nofile_limit ();
  if (opt_mlock && (errno = -mloop_lock_memory ()) != 0)
    die ("--mlock: mlockall: %s", strerror (errno));

  /* Block the signals before any thread exists (an RBD store's librados
   * starts its own as it opens), so every thread inherits the mask and
   * only the signalfd sees them.
   */
  sigemptyset (&sigs);
  sigaddset (&sigs, SIGTERM);
  sigaddset (&sigs, SIGINT);
  sigaddset (&sigs, SIGHUP);
  pthread_sigmask (SIG_BLOCK, &sigs, NULL);

  mloop_engine_config_init (&cfg);
  cfg.path = argv[1];
  cfg.want_write = !opt_read_only;
  if (opt_direct && mloop_direct_mode_parse (opt_direct, &cfg.direct) < 0)
    die ("--direct=%s: must be auto, on or off", opt_direct);
  cfg.window.offset = parse_size ("offset", opt_offset, 0, 0);
  cfg.overlay = opt_overlay;
  cfg.overlay_adopt_base = opt_overlay_adopt_base;
  cfg.overlay_must_exist = opt_overlay_must_exist;
  cfg.window.sizelimit = parse_size ("sizelimit", opt_sizelimit, 0, 0);
  cfg.ceph_conf = opt_ceph_conf;
  cfg.ceph_id = opt_ceph_id;
  cfg.shared = opt_shared;
  cfg.lock_record = opt_lock_record;
  cfg.io_timeout = (unsigned) opt_io_timeout;
  cfg.notice = say_notice;
  if (served_image_open (&image, &cfg, opt_read_only, discard, say_notice,
                         err, sizeof err) < 0)
    die ("%s", err);
  export = image.export;
  export.name = opt_export_name;
  export.tls = tls_mode;
  export.start_tls = start_tls;

  signal (SIGPIPE, SIG_IGN);
  sfd = signalfd (-1, &sigs, SFD_CLOEXEC);

  offload = offload_start ((unsigned) opt_helper_threads);
  if (offload == NULL)
    die ("starting %d helper threads: %s", opt_helper_threads,
         strerror (errno));
  wopts = (struct worker_options) {
    .ring_depth = (unsigned) opt_queue_depth,
    .budget = &budget, .offload = offload,
    .drain_timeout = (unsigned) opt_drain_timeout,
    .close_client = admission_close,
    .splice_replies = splice,
  };
  if (wopts.splice_replies && !(wopts.splice_replies = splice_out_works ()))
    fprintf (stderr, "mloop-server: read replies are copied, not sent by "
             "page reference: splicing into a Unix socket fails here: "
             "%s\n", strerror (errno));
  if (opt_stats_file &&
      (wopts.stats = mloop_stats_create (opt_stats_file)) == NULL)
    die ("--stats-file %s: %s", opt_stats_file, strerror (errno));
  if (opt_trace == NULL && getenv ("MLOOP_TRACE") && *getenv ("MLOOP_TRACE"))
    opt_trace = g_strdup (getenv ("MLOOP_TRACE"));
  if (opt_trace && mloop_trace_open (opt_trace, false) == -1)
    die ("--trace %s: %s", opt_trace, strerror (errno));
  if (served_image_start (&image, (unsigned) opt_threads, &wopts,
                          err, sizeof err) == -1)
    die ("%s", err);
  if (listener_open (&listener, opt_listen, err, sizeof err) == -1)
    die ("%s", err);
  /* The workers mark themselves; asking here tells us once, and only
   * now, so that a refusal above stays the one line it should be.
   */
  if (!mloop_io_flusher_thread ())
    fprintf (stderr, "mloop-server: warning: PR_SET_IO_FLUSHER not "
             "permitted (needs CAP_SYS_RESOURCE): serving a local device "
             "under memory pressure can deadlock\n");
  if (mloop_test_ack_flush_early ())
    fprintf (stderr, "mloop-server: warning: MLOOP_TEST_ACK_FLUSH_EARLY=1: "
             "FLUSH is acknowledged without being done (for tests only)\n");
  pending_init ((unsigned) opt_handshake_timeout, (unsigned) opt_max_handshakes);
  pthread_attr_init (&attr);
  pthread_attr_setdetachstate (&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize (&attr, tls_mode == HANDSHAKE_TLS_OFF
                             ? HANDSHAKE_STACK : HANDSHAKE_STACK_TLS);
  if (!write_pid_file (err, sizeof err)) {
    listener_close (&listener);       /* no socket left that nobody serves */
    die ("%s", err);
  }

  for (;;) {
    /* While backing off, the listener is left out (fd -1 is ignored). */
    struct pollfd p[2] = { { backoff ? -1 : listener.fd, POLLIN, 0 },
                           { sfd, POLLIN, 0 } };
    int wait = pending_expire ();
    int log_due = log_limit_due_ms ();

    if (backoff && (wait == -1 || wait > ACCEPT_BACKOFF_MS))
      wait = ACCEPT_BACKOFF_MS;
    /* Say how many log lines were suppressed once their window ends. */
    if (log_due != -1 && (wait == -1 || wait > log_due))
      wait = log_due;
    backoff = 0;
    if (poll (p, 2, wait) == -1 && errno != EINTR)
      break;
    if (p[1].revents && !on_signal (sfd))
      break;                    /* SIGTERM or SIGINT */
    if ((p[0].revents & POLLIN) && !accept_one (listener.fd, &attr))
      backoff = 1;
    log_limit_report (0);
  }

  listener_close (&listener);
  pending_drain ();
  pthread_attr_destroy (&attr);
  /* All at once, so their drain deadlines run together. */
  served_image_begin_stop (&image);
  served_image_stop (&image);
  offload_stop (offload);       /* idle: each worker waited for its jobs */
  log_limit_report (1);
  if (opt_pid_file)
    unlink (opt_pid_file);
  served_image_close (&image);
  close (sfd);
  return EXIT_SUCCESS;
}
