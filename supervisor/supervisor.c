/* mloop-supervisor — keeps one attached device served.
 *
 * `mloop attach` starts one per device.  For a local image it holds a
 * keeper (keeper.h: the server's restarts, healed connections, planned
 * restarts, an RBD image's size, autoclear), on a glib main loop that
 * also waits for SIGTERM/SIGINT (stop) and SIGUSR1 (a planned restart,
 * asked by `mloop resize` of a device nbdkit serves).
 *
 * It is a child subreaper, so a daemonizing nbdkit's daemon becomes its
 * child and its exit status can be reaped.  It logs to stderr (the
 * device directory's supervisor.log).
 *
 *   mloop-supervisor --dir DIR --server native|nbdkit [--threads N]
 *                    [--read-only] IMAGE
 *
 * A device on a remote export has one too, in a mode of its own that
 * only heals connections (remote.h):
 *
 *   mloop-supervisor --dir DIR --remote nbd://HOST[:PORT]/NAME
 *
 * And one served through ublk by mloop-ublk, in a third mode (ublk.h):
 *
 *   mloop-supervisor --dir DIR --ublk [--queues N] [--block-size N]
 *                    [--id N] IMAGE
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "device_state.h"
#include "held_image.h"
#include "keeper.h"
#include "remote.h"
#include "ublk.h"

static GMainLoop *loop;

static gboolean
on_restart_signal (gpointer data)
{
  keeper_restart_server (data);
  return G_SOURCE_CONTINUE;
}

/* Kept, not removed: GLib gives a signal whose last source goes back
 * its default action, and a second SIGTERM during the stop that follows
 * (a recovery, a flush) would kill the process half way through it.
 */
static gboolean
on_stop_signal (gpointer unused)
{
  g_main_loop_quit (loop);
  return G_SOURCE_CONTINUE;
}

static void
on_released (struct keeper *k, void *unused)
{
  g_main_loop_quit (loop);
}

static void
on_remote_released (struct remote_keeper *rk, void *unused)
{
  g_main_loop_quit (loop);
}

/* Writes our pid into DIR's supervisor pid file: `mloop attach`
 * connects the device once it exists, so we listen for the kernel's
 * announcements by then.  Its path, to g_free.
 */
static char *
write_pid_file (const char *dir)
{
  char *path = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_PID, NULL);
  char text[32];

  snprintf (text, sizeof text, "%d\n", (int) getpid ());
  if (!g_file_set_contents (path, text, -1, NULL)) {
    fprintf (stderr, "mloop-supervisor: cannot write %s\n", path);
    g_free (path);
    return NULL;
  }
  return path;
}

static void
on_ublk_ended (struct ublk_keeper *uk, void *unused)
{
  g_main_loop_quit (loop);
}

/* A device served through ublk (ublk.h).  The pid file first: attach
 * waits for it, and the first mloop-ublk takes a while to make the
 * device.
 */
static int
supervise_ublk (const char *dir, const struct mloop_ublk_spec *spec,
                unsigned dead_timeout_s, pid_t adopted)
{
  g_autofree char *pid_path = write_pid_file (dir);
  struct ublk_keeper *uk;
  char err[512];

  if (pid_path == NULL)
    return EXIT_FAILURE;
  loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  uk = ublk_keeper_new (dir, spec, dead_timeout_s, stderr, on_ublk_ended,
                        NULL);
  /* The first start's failure is attach's failure: say it and leave. */
  if (ublk_keeper_start (uk, adopted, err, sizeof err) == -1) {
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    ublk_keeper_stop (uk);
    g_unlink (pid_path);
    return EXIT_FAILURE;
  }
  g_main_loop_run (loop);
  ublk_keeper_stop (uk);
  g_unlink (pid_path);
  return EXIT_SUCCESS;
}

/* A device on the export URI (remote.h). */
static int
supervise_remote (const char *dir, const char *uri)
{
  g_autofree char *pid_path = NULL;
  struct remote_keeper *rk;
  char err[512];

  loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  rk = remote_keeper_new (dir, uri, stderr, on_remote_released, NULL, err,
                          sizeof err);
  if (rk == NULL) {
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    return EXIT_FAILURE;
  }
  pid_path = write_pid_file (dir);
  if (pid_path == NULL) {
    remote_keeper_stop (rk);
    return EXIT_FAILURE;
  }
  g_main_loop_run (loop);
  remote_keeper_stop (rk);
  g_unlink (pid_path);
  return EXIT_SUCCESS;
}

int
main (int argc, char **argv)
{
  g_autofree char *dir = NULL, *server_kind = NULL, *remote = NULL,
    *overlay = NULL;
  gint threads = 0, queues = 1, block_size = 0, dead_timeout = 30, id = -1;
  gint adopt = 0, io_timeout = 0;
  gboolean read_only = FALSE, ublk = FALSE;
  gint64 offset = 0, sizelimit = 0;
  GOptionEntry entries[] = {
    { "dir", 'd', 0, G_OPTION_ARG_FILENAME, &dir,
      "The device's directory (required)", "DIR" },
    { "server", 's', 0, G_OPTION_ARG_STRING, &server_kind,
      "native or nbdkit", "KIND" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads,
      "Server IO workers", "N" },
    { "read-only", 'r', 0, G_OPTION_ARG_NONE, &read_only,
      "Serve read-only", NULL },
    { "offset", 'o', 0, G_OPTION_ARG_INT64, &offset,
      "Serve the image from this byte on", "BYTES" },
    { "sizelimit", 0, 0, G_OPTION_ARG_INT64, &sizelimit,
      "Serve at most this many bytes", "BYTES" },
    { "overlay", 0, 0, G_OPTION_ARG_FILENAME, &overlay,
      "Write to this copy-on-write overlay", "FILE" },
    { "adopt", 0, 0, G_OPTION_ARG_INT, &adopt,
      "The first server, started as our child: wait for it to listen",
      "PID" },
    { "remote", 0, 0, G_OPTION_ARG_STRING, &remote,
      "No server: reconnect the device to this export (remote.h)",
      "nbd://HOST[:PORT]/NAME" },
    { "ublk", 0, 0, G_OPTION_ARG_NONE, &ublk,
      "Serve IMAGE through ublk with mloop-ublk (ublk.h)", NULL },
    { "queues", 'q', 0, G_OPTION_ARG_INT, &queues,
      "ublk: hardware queues", "N" },
    { "block-size", 'b', 0, G_OPTION_ARG_INT, &block_size,
      "ublk: logical block size", "BYTES" },
    { "id", 'n', 0, G_OPTION_ARG_INT, &id,
      "ublk: add the device as /dev/ublkbN", "N" },
    { "dead-timeout", 0, 0, G_OPTION_ARG_INT, &dead_timeout,
      "ublk: stop the device after this long without a server", "S" },
    { "io-timeout", 0, 0, G_OPTION_ARG_INT, &io_timeout,
      "An RBD image's servers fail requests the cluster has not answered "
      "in this long", "S" },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("IMAGE");
  g_autoptr (GError) gerr = NULL;
  g_autofree char *pid_path = NULL;
  struct keeper_config config = { 0 };
  struct keeper *k;
  char err[512];

  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr)) {
    fprintf (stderr, "mloop-supervisor: %s\n", gerr->message);
    return EXIT_FAILURE;
  }
  if (offset < 0 || sizelimit < 0 || io_timeout < 0) {
    fprintf (stderr, "mloop-supervisor: --offset, --sizelimit and "
             "--io-timeout must not be negative\n");
    return EXIT_FAILURE;
  }
  if (remote && argc == 1 && dir)
    return supervise_remote (dir, remote);
  if (ublk) {
    const struct mloop_ublk_spec spec = {
      .image = argv[1], .offset = (uint64_t) offset,
      .sizelimit = (uint64_t) sizelimit, .overlay = overlay,
      .queues = (unsigned) queues,
      .id = id, .block_size = (uint32_t) block_size, .read_only = read_only,
      .io_timeout = (unsigned) io_timeout,
    };

    if (argc != 2 || dir == NULL || queues < 1 || block_size < 0 ||
        dead_timeout < 1 || id < -1) {
      fprintf (stderr, "mloop-supervisor: --ublk needs --dir DIR, one IMAGE, "
               "--queues and --dead-timeout of at least 1\n");
      return EXIT_FAILURE;
    }
    return supervise_ublk (dir, &spec, (unsigned) dead_timeout,
                           (pid_t) adopt);
  }
  if (argc != 2 || dir == NULL) {
    fprintf (stderr, "mloop-supervisor: need --dir DIR and one IMAGE, "
             "or --dir DIR and --remote URI\n");
    return EXIT_FAILURE;
  }
  config.server.kind = server_kind
    ? mloop_server_kind_find (server_kind, err, sizeof err)
    : mloop_server_kind_default ();
  if (config.server.kind == NULL) {
    fprintf (stderr, "mloop-supervisor: --server %s\n", err);
    return EXIT_FAILURE;
  }
  config.server.image = argv[1];
  /* Inherited from attach: every server gets it (held_image.h). */
  if (mloop_is_held_image (config.server.image))
    mloop_held_image_set (MLOOP_HELD_IMAGE_FD);
  config.server.threads = threads > 0 ? (unsigned) threads : 0;
  config.server.read_only = read_only;
  config.server.offset = (uint64_t) offset;
  config.server.sizelimit = (uint64_t) sizelimit;
  config.server.overlay = overlay;
  config.server.io_timeout = (unsigned) io_timeout;
  config.dir = dir;
  config.log = stderr;
  config.released = on_released;

  /* Orphans (nbdkit's daemon) become our children, so we can reap them. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  loop = g_main_loop_new (NULL, FALSE);
  k = keeper_new (&config);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  g_unix_signal_add (SIGUSR1, on_restart_signal, k);
  /* The first start's failure is attach's failure: say it and leave. */
  if (keeper_start (k, (pid_t) adopt, err, sizeof err) == -1) {
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    return EXIT_FAILURE;
  }
  /* Attach connects the device once this file is there: the keeper's
   * witness of an overlay is open by then, before any request.
   */
  pid_path = write_pid_file (dir);
  if (pid_path == NULL) {
    keeper_stop (k);
    return EXIT_FAILURE;
  }
  g_main_loop_run (loop);

  keeper_stop (k);
  g_unlink (pid_path);
  return EXIT_SUCCESS;
}
