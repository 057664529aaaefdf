/* mloop-supervisor — keeps the server of one attached device alive.
 *
 * `mloop attach` starts one per device (device/server_process.c); it starts
 * the device's server and, whenever that server dies, starts a new one
 * with backoff and hands the kernel fresh connections to it
 * (NBD_CMD_RECONFIGURE).  The device is attached with a dead-connection
 * timeout, so while the server is down the kernel holds IO instead of
 * failing it; requests that were in flight on the dead connections are
 * requeued by the kernel when their request timeout expires.
 *
 * It is a child subreaper, so a daemonizing nbdkit's daemon becomes its
 * child and its exit status can be reaped.  A glib main loop waits on the
 * server's pidfd, the restart timer and SIGTERM/SIGINT.  It logs to
 * stderr (the device directory's supervisor.log) and records restarts in
 * the directory's "supervisor" file for `mloop status`.
 *
 *   mloop-supervisor --dir DIR --server native|nbdkit [--threads N]
 *                    [--read-only] IMAGE
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "device_state.h"
#include "nbd_connect.h"
#include "nbd_netlink.h"
#include "server_process.h"

#define START_TIMEOUT_MS 60000
#define STOP_TIMEOUT_MS 10000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 8000
/* A server that lived this long earns a quick restart again. */
#define HEALTHY_US (30 * G_USEC_PER_SEC)

static struct {
  struct mloop_server_spec spec;
  char *dir;
  pid_t server;
  int pidfd;
  gint64 started_at;
  unsigned restarts;
  char *last_failure;
  unsigned backoff_ms;
  GMainLoop *loop;
} sv = { .pidfd = -1, .backoff_ms = BACKOFF_MIN_MS };

static void G_GNUC_PRINTF (1, 2)
say (const char *fmt, ...)
{
  g_autoptr (GDateTime) now = g_date_time_new_now_local ();
  g_autofree char *stamp = g_date_time_format (now, "%F %T");
  va_list ap;

  fprintf (stderr, "mloop-supervisor: %s: ", stamp);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
}

static void
record (void)
{
  struct mloop_supervisor_record r = {
    .server_pid = sv.server, .restarts = sv.restarts,
    .last_failure = sv.last_failure,
  };
  char err[512];

  if (mloop_state_save_supervisor (sv.dir, &r, err, sizeof err) == -1)
    say ("%s", err);
}

static gboolean on_server_exit (gint fd, GIOCondition c, gpointer unused);

/* Starts a server and watches it.  0, or -1 with ERR. */
static int
start_server (char *err, size_t errlen)
{
  /* A killed server leaves its pid file and socket behind: the pid file
   * would look like the new server's, and the socket path must be free.
   */
  g_unlink (sv.spec.pid_file);
  g_unlink (sv.spec.socket_path);
  if (mloop_server_start (&sv.spec, START_TIMEOUT_MS, &sv.server,
                          err, errlen) == -1)
    return -1;
  sv.pidfd = (int) syscall (SYS_pidfd_open, sv.server, 0);
  if (sv.pidfd == -1) {
    snprintf (err, errlen, "pidfd_open: %s", strerror (errno));
    mloop_server_stop (sv.server, sv.spec.socket_path, STOP_TIMEOUT_MS);
    return -1;
  }
  g_unix_fd_add (sv.pidfd, G_IO_IN, on_server_exit, NULL);
  sv.started_at = g_get_monotonic_time ();
  record ();
  return 0;
}

/* Hands the kernel fresh connections to the new server.  Before the
 * device's state exists, `mloop attach` is still connecting it itself.
 */
static int
reconnect_device (char *err, size_t errlen)
{
  struct mloop_device_state st;
  struct mloop_nbd_export x;
  int fds[16];
  unsigned n;
  int r;

  if (mloop_state_load (sv.dir, &st) == -1)
    return 0;
  n = st.connections > 0 && st.connections <= 16 ? st.connections : 1;
  if (mloop_nbd_connect_unix (sv.spec.socket_path, n, fds, &x,
                              err, errlen) == -1) {
    mloop_state_clear (&st);
    return -1;
  }
  r = mloop_nbd_netlink_reconfigure (st.index, st.file, fds, n, st.timeout,
                                     err, errlen);
  mloop_nbd_close_all (fds, n);
  if (r == 0)
    say ("server pid %d serves /dev/nbd%d again over %u connections",
         (int) sv.server, st.index, n);
  mloop_state_clear (&st);
  return r < 0 ? -1 : 0;
}

static gboolean
restart (gpointer unused)
{
  char err[512];

  if (start_server (err, sizeof err) == 0 &&
      reconnect_device (err, sizeof err) == 0)
    return G_SOURCE_REMOVE;
  say ("restart failed: %s", err);
  g_free (sv.last_failure);
  sv.last_failure = g_strdup (err);
  record ();
  if (sv.server > 0 && sv.pidfd != -1)
    /* It started but the device could not reach it: try again whole. */
    kill (sv.server, SIGKILL);
  else
    g_timeout_add (sv.backoff_ms, restart, NULL);
  sv.backoff_ms = MIN (sv.backoff_ms * 2, BACKOFF_MAX_MS);
  return G_SOURCE_REMOVE;
}

static char *
describe_exit (int status)
{
  if (WIFSIGNALED (status))
    return g_strdup_printf ("killed by signal %d (%s)", WTERMSIG (status),
                            strsignal (WTERMSIG (status)));
  return g_strdup_printf ("exited with status %d", WEXITSTATUS (status));
}

static gboolean
on_server_exit (gint fd, GIOCondition c, gpointer unused)
{
  int status = 0;

  /* Ours to reap: our child, or adopted as subreaper. */
  if (waitpid (sv.server, &status, WNOHANG) != sv.server)
    status = 0;
  close (sv.pidfd);
  sv.pidfd = -1;
  g_free (sv.last_failure);
  sv.last_failure = g_strdup_printf ("server pid %d %s", (int) sv.server,
                                     describe_exit (status));
  if (g_get_monotonic_time () - sv.started_at > HEALTHY_US)
    sv.backoff_ms = BACKOFF_MIN_MS;
  sv.server = 0;
  sv.restarts++;
  say ("%s; restart %u in %u ms", sv.last_failure, sv.restarts,
       sv.backoff_ms);
  record ();
  g_timeout_add (sv.backoff_ms, restart, NULL);
  return G_SOURCE_REMOVE;
}

static gboolean
on_stop_signal (gpointer unused)
{
  g_main_loop_quit (sv.loop);
  return G_SOURCE_REMOVE;
}

int
main (int argc, char **argv)
{
  g_autofree char *server_kind = NULL;
  gint threads = 0;
  gboolean read_only = FALSE;
  GOptionEntry entries[] = {
    { "dir", 'd', 0, G_OPTION_ARG_FILENAME, &sv.dir,
      "The device's directory (required)", "DIR" },
    { "server", 's', 0, G_OPTION_ARG_STRING, &server_kind,
      "native or nbdkit", "KIND" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads,
      "Server IO workers", "N" },
    { "read-only", 'r', 0, G_OPTION_ARG_NONE, &read_only,
      "Serve read-only", NULL },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("IMAGE");
  g_autoptr (GError) gerr = NULL;
  g_autofree char *pid_path = NULL;
  char err[512], pid_text[32];

  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr)) {
    fprintf (stderr, "mloop-supervisor: %s\n", gerr->message);
    return EXIT_FAILURE;
  }
  if (argc != 2 || sv.dir == NULL) {
    fprintf (stderr, "mloop-supervisor: need --dir DIR and one IMAGE\n");
    return EXIT_FAILURE;
  }
  sv.spec.kind = server_kind ? mloop_server_kind_find (server_kind, err,
                                                       sizeof err)
    : mloop_server_kind_default ();
  if (sv.spec.kind == NULL) {
    fprintf (stderr, "mloop-supervisor: --server %s\n", err);
    return EXIT_FAILURE;
  }
  sv.spec.image = argv[1];
  sv.spec.threads = threads > 0 ? (unsigned) threads : 0;
  sv.spec.read_only = read_only;
  sv.spec.socket_path = g_build_filename (sv.dir, MLOOP_DIR_SOCKET, NULL);
  sv.spec.pid_file = g_build_filename (sv.dir, MLOOP_DIR_SERVER_PID, NULL);
  sv.spec.log_file = g_build_filename (sv.dir, MLOOP_DIR_SERVER_LOG, NULL);
  sv.spec.stats_file = g_build_filename (sv.dir, MLOOP_DIR_STATS, NULL);

  /* Orphans (nbdkit's daemon) become our children, so we can reap them. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  pid_path = g_build_filename (sv.dir, MLOOP_DIR_SUPERVISOR_PID, NULL);
  snprintf (pid_text, sizeof pid_text, "%d\n", (int) getpid ());
  g_file_set_contents (pid_path, pid_text, -1, NULL);

  sv.loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  /* The first start's failure is attach's failure: say it and leave. */
  if (start_server (err, sizeof err) == -1) {
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    g_unlink (pid_path);
    return EXIT_FAILURE;
  }
  say ("server pid %d started for %s", (int) sv.server, sv.spec.image);
  g_main_loop_run (sv.loop);

  say ("stopping server pid %d", (int) sv.server);
  if (sv.server > 0)
    mloop_server_stop (sv.server, sv.spec.socket_path, STOP_TIMEOUT_MS);
  if (sv.server > 0)
    waitpid (sv.server, NULL, WNOHANG);
  g_unlink (pid_path);
  return EXIT_SUCCESS;
}
