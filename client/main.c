/* mloop — a losetup-like command for NBD block devices.
 *
 * This file parses the command line and prints; everything it does is in
 * the library (device/attach.h and friends), which never prints, so tests
 * can drive the same code.  Commands: attach, detach, resize, list,
 * status, serve; mount and umount are in mount_cmd.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "attach.h"
#include "parse.h"
#include "block_queue.h"
#include "extras.h"
#include "mount_cmd.h"
#include "overlay_cmd.h"
#include "print.h"
#include "rbd_options.h"
#include "resize.h"
#include "serve.h"
#include "store_name.h"

/* Every message of the command goes through mloop_print_error. */
#define error mloop_print_error

/* Parses the window options of COMMAND (losetup's --offset and
 * --sizelimit, sizes with K, M, G, T suffixes) into *OFFSET and
 * *SIZELIMIT.  Returns false after saying what is wrong.
 */
static bool
parse_window (const char *command, const char *offset, const char *sizelimit,
              uint64_t *offset_out, uint64_t *sizelimit_out)
{
  if (offset && mloop_size_parse (offset, offset_out) < 0) {
    error ("%s: --offset %s: must be a size in bytes (suffixes K, M, G, T)",
           command, offset);
    return false;
  }
  if (sizelimit && mloop_size_parse (sizelimit, sizelimit_out) < 0) {
    error ("%s: --sizelimit %s: must be a size in bytes (suffixes K, M, G, "
           "T)", command, sizelimit);
    return false;
  }
  return true;
}

/* The name COMMAND serves FILE by: with --ceph-conf CONF and --ceph-id
 * ID recorded in it (store_name.h), so that a restarted server connects
 * as the first did.  Returns false after saying what is wrong.
 */
static bool
ceph_name (const char *command, const char *file, const char *conf,
           const char *id, char **name)
{
  char err[512];

  if (conf == NULL && id == NULL) {
    *name = g_strdup (file);
    return true;
  }
  *name = mloop_rbd_name_with (file, conf, id, err, sizeof err);
  if (*name == NULL)
    error ("%s: %s", command, err);
  return *name != NULL;
}

/* Parses the options of one command; removes them from argv. */
static bool
parse (const char *usage, const char *summary, GOptionEntry *entries,
       int *argc, char ***argv)
{
  g_autoptr (GOptionContext) ctx = g_option_context_new (usage);
  g_autoptr (GError) gerr = NULL;

  g_option_context_set_summary (ctx, summary);
  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, argc, argv, &gerr)) {
    error ("%s", gerr->message);
    return false;
  }
  return true;
}

/* mloop attach --verbose: each step's time, as it ends. */
static void
print_step (const char *step, double ms, void *unused)
{
  fprintf (stderr, "mloop: attach: %-16s %8.1f ms\n", step, ms);
}

static int
cmd_attach (int argc, char **argv)
{
  gboolean find = FALSE, read_only = FALSE, partscan = FALSE;
  gboolean no_partscan = FALSE, autoclear = FALSE, verbose = FALSE;
  g_auto (GStrv) queue_options = NULL;
  /* -1: not given, so the library's default applies. */
  gint threads = -1, connections = -1, block_size = 0, timeout = -1;
  gint dead_timeout = -1;
  g_autofree char *device = NULL, *server = NULL, *transport = NULL;
  g_autofree char *offset = NULL, *sizelimit = NULL, *overlay = NULL;
  g_autofree char *dev = NULL, *ceph_conf = NULL, *ceph_id = NULL;
  g_autofree char *name = NULL;
  GOptionEntry entries[] = {
    { "find", 'f', 0, G_OPTION_ARG_NONE, &find,
      "Use the first free /dev/nbdN (the default without --device)", NULL },
    { "device", 'd', 0, G_OPTION_ARG_STRING, &device,
      "Use this device (/dev/ublkbN: the ublk transport)",
      "/dev/nbdN|/dev/ublkbN" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads,
      "Server IO workers (default 4)", "N" },
    { "connections", 'c', 0, G_OPTION_ARG_INT, &connections,
      "Connections = hardware queues (default: CPUs, at most 16)", "M" },
    { "read-only", 'r', 0, G_OPTION_ARG_NONE, &read_only,
      "Attach read-only", NULL },
    { "block-size", 'b', 0, G_OPTION_ARG_INT, &block_size,
      "Logical block size: 512, 1024, 2048 or 4096", "BYTES" },
    { "timeout", 0, 0, G_OPTION_ARG_INT, &timeout,
      "Request timeout in seconds (default 30)", "S" },
    { "dead-timeout", 0, 0, G_OPTION_ARG_INT, &dead_timeout,
      "How long IO waits for a reconnect while every connection is dead "
      "(default: the request timeout; 120 for nbd://)", "S" },
    { "offset", 'o', 0, G_OPTION_ARG_STRING, &offset,
      "Start this many bytes into FILE (like losetup)", "SIZE" },
    { "sizelimit", 0, 0, G_OPTION_ARG_STRING, &sizelimit,
      "Attach at most this many bytes of FILE (like losetup)", "SIZE" },
    { "overlay", 0, 0, G_OPTION_ARG_FILENAME, &overlay,
      "Write to this copy-on-write overlay (made if absent) and only read "
      "FILE; temp: a new one, deleted at detach", "FILE|temp" },
    { "partscan", 'P', 0, G_OPTION_ARG_NONE, &partscan,
      "Read the partition table (the default)", NULL },
    { "no-partscan", 0, 0, G_OPTION_ARG_NONE, &no_partscan,
      "Do not make /dev/nbdNpK devices for the image's partitions", NULL },
    { "autoclear", 0, 0, G_OPTION_ARG_NONE, &autoclear,
      "Detach when the last user closes the device", NULL },
    { "verbose", 'v', 0, G_OPTION_ARG_NONE, &verbose,
      "Say on stderr how long each step of the attach takes", NULL },
    { "queue-option", 'Q', 0, G_OPTION_ARG_STRING_ARRAY, &queue_options,
      "Set a file of /sys/block/nbdN/queue (repeatable)", "NAME=VALUE" },
    { "server", 's', 0, G_OPTION_ARG_STRING, &server,
      "native (mloop-server, default) or nbdkit (with the mloop plugin)",
      "KIND" },
    { "transport", 'T', 0, G_OPTION_ARG_STRING, &transport,
      "nbd (/dev/nbdN, the default), ublk (/dev/ublkbN, no socket) or "
      "auto (ublk where the kernel has it and FILE is local)", "NAME" },
    MLOOP_CEPH_OPTION_ENTRIES (ceph_conf, ceph_id),
    G_OPTION_ENTRY_NULL
  };
  struct mloop_attach_request req = { .index = -1 };
  struct mloop_steps steps = { .done = print_step };
  struct mloop_device_state st;
  char err[1024];
  gint64 start;

  if (!parse ("FILE|rbd:POOL/IMAGE[@SNAP]|nbd://HOST[:PORT]/NAME",
              "Attach FILE, an RBD image or a remote export as /dev/nbdN "
              "(or FILE or an RBD image as /dev/ublkbN) and print the "
              "device.",
              entries, &argc, &argv))
    return EXIT_FAILURE;
  if (argc != 2)
    return error ("attach: give exactly one FILE (see mloop attach --help)");
  if (find && device)
    return error ("attach: --find and --device exclude each other");
  if (device &&
      (req.index = mloop_device_index (device, &req.ublk_index)) < 0)
    return error ("attach: --device %s: not a device name (/dev/nbdN or "
                  "/dev/ublkbN)", device);
  if (threads != -1 && (threads < 1 || threads > 64))
    return error ("attach: --threads %d: must be 1..64", threads);
  if (connections != -1 &&
      (connections < 1 || connections > MLOOP_MAX_CONNECTIONS))
    return error ("attach: --connections %d: must be 1..%d", connections,
                  MLOOP_MAX_CONNECTIONS);
  if (block_size && block_size != 512 && block_size != 1024 &&
      block_size != 2048 && block_size != 4096)
    return error ("attach: --block-size %d: must be 512, 1024, 2048 or 4096",
                  block_size);
  if (timeout != -1 && timeout < 1)
    return error ("attach: --timeout %d: must be positive", timeout);
  if (dead_timeout != -1 && dead_timeout < 1)
    return error ("attach: --dead-timeout %d: must be positive",
                  dead_timeout);
  if (server &&
      (req.server = mloop_server_kind_find (server, err, sizeof err)) == NULL)
    return error ("attach: --server %s", err);
  /* --device /dev/ublkbN alone says which transport. */
  if (transport == NULL && req.ublk_index)
    req.transport = MLOOP_CHOOSE_UBLK;
  else if (transport == NULL || strcmp (transport, "nbd") == 0)
    req.transport = MLOOP_CHOOSE_NBD;
  else if (strcmp (transport, "ublk") == 0)
    req.transport = MLOOP_CHOOSE_UBLK;
  else if (strcmp (transport, "auto") == 0)
    req.transport = MLOOP_CHOOSE_AUTO;
  else
    return error ("attach: --transport %s: must be nbd, ublk or auto",
                  transport);
  if (!parse_window ("attach", offset, sizelimit, &req.offset,
                     &req.sizelimit))
    return EXIT_FAILURE;
  if ((req.offset || req.sizelimit) &&
      (strstr (argv[1], "://") || mloop_is_rbd_name (argv[1])))
    return error ("attach: --offset and --sizelimit need a local FILE, not "
                  "%s", argv[1]);
  if (geteuid () != 0) {
    const bool only_user_options = !device && threads == -1 &&
      connections == -1 && !block_size && timeout == -1 &&
      dead_timeout == -1 && !offset && !sizelimit && !overlay &&
      !queue_options && !server && !ceph_conf && !ceph_id && !verbose &&
      (transport == NULL || strcmp (transport, "nbd") == 0);
    const struct mloop_service_attach user_req = {
      .file = argv[1], .read_only = read_only, .no_partscan = no_partscan,
      .autoclear = autoclear,
    };
    const struct mloop_cli_extras *extras;

    if (!only_user_options || strstr (argv[1], "://") ||
        mloop_is_rbd_name (argv[1]))
      return error ("attach: not root: mloop's D-Bus service attaches a "
                    "local FILE for you, with --read-only, --no-partscan "
                    "and --autoclear only");
    if ((extras = mloop_cli_extras_load ()) == NULL)
      return EXIT_FAILURE;
    if (extras->service_attach (&user_req, &dev, err, sizeof err) == -1)
      return error ("attach %s: %s", argv[1], err);
    printf ("%s\n", dev);
    return EXIT_SUCCESS;
  }
  if (!ceph_name ("attach", argv[1], ceph_conf, ceph_id, &name))
    return EXIT_FAILURE;
  req.file = name;
  req.overlay = overlay;
  req.threads = threads == -1 ? 0 : threads;
  req.connections = connections == -1 ? 0 : connections;
  req.read_only = read_only;
  req.block_size = block_size;
  if (partscan && no_partscan)
    return error ("attach: --partscan and --no-partscan exclude each other");
  req.no_partscan = no_partscan;
  req.autoclear = autoclear;
  if (mloop_queue_options_check (queue_options, err, sizeof err) == -1)
    return error ("attach: %s", err);
  req.queue_options = queue_options;
  req.timeout = timeout == -1 ? 0 : timeout;
  req.dead_timeout = dead_timeout == -1 ? 0 : dead_timeout;

  if (verbose) {
    mloop_steps_start (&steps);
    req.steps = &steps;
  }
  start = g_get_monotonic_time ();
  if (mloop_attach (&req, &st, err, sizeof err) == -1)
    return error ("attach %s: %s", req.file, err);
  dev = mloop_state_device_path (&st);
  if (verbose)
    print_step ("in all", (double) (g_get_monotonic_time () - start) / 1000.0,
                NULL);
  printf ("%s\n", dev);
  mloop_state_clear (&st);
  return EXIT_SUCCESS;
}

static int
detach_one (struct mloop_device_state *st)
{
  g_autofree char *dev = mloop_state_device_path (st);
  char err[1024];
  int r = EXIT_SUCCESS;

  if (mloop_detach (st, err, sizeof err) == -1)
    r = error ("detach %s: %s", dev, err);
  mloop_state_clear (st);
  return r;
}

/* detach --all: devices detached this many at a time.  Most of a detach
 * is waiting (for the kernel to send its disconnects, for the server to
 * exit), and each holds only its own device's lock.
 */
#define DETACH_AT_ONCE 16

static void
detach_in_pool (gpointer data, gpointer failed)
{
  if (detach_one (data) != EXIT_SUCCESS)
    g_atomic_int_set ((gint *) failed, 1);
}

/* Detaches every device in LIST (N of them), several at once. */
static int
detach_list (struct mloop_device_state *list, size_t n)
{
  gint failed = 0;
  GThreadPool *pool = g_thread_pool_new (detach_in_pool, &failed,
                                         DETACH_AT_ONCE, TRUE, NULL);

  for (size_t i = 0; i < n; i++)
    g_thread_pool_push (pool, &list[i], NULL);
  g_thread_pool_free (pool, FALSE, TRUE);       /* waits for them all */
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* Detach run by a user who is not root: mloop's D-Bus service detaches
 * the user's own devices (others' with an administrator's consent).
 */
static int
detach_through_service (bool all, int argc, char **argv)
{
  const struct mloop_cli_extras *extras;
  char err[1024];
  int r = EXIT_SUCCESS;

  if (all)
    return error ("detach: --all needs root");
  if ((extras = mloop_cli_extras_load ()) == NULL)
    return EXIT_FAILURE;
  for (int i = 1; i < argc; i++) {
    /* The service takes a FILE's path absolute only (its directory is
     * not the caller's): a device's name, a URI or an RBD name as it is.
     */
    bool ublk;
    g_autofree char *what = mloop_device_index (argv[i], &ublk) >= 0 ||
      strstr (argv[i], "://") || mloop_is_rbd_name (argv[i])
      ? g_strdup (argv[i]) : g_canonicalize_filename (argv[i], NULL);

    if (extras->service_detach (what, err, sizeof err) == -1)
      r = error ("detach %s: %s", argv[i], err);
  }
  return r;
}

static int
cmd_detach (int argc, char **argv)
{
  gboolean all = FALSE;
  GOptionEntry entries[] = {
    { "all", 'a', 0, G_OPTION_ARG_NONE, &all,
      "Detach every device mloop attached", NULL },
    G_OPTION_ENTRY_NULL
  };
  struct mloop_device_state st, *list;
  char err[1024];
  size_t n;
  int r = EXIT_SUCCESS;

  if (!parse ("DEVICE|FILE...", "Disconnect devices and stop their servers.",
              entries, &argc, &argv))
    return EXIT_FAILURE;
  if (all == (argc > 1))
    return error ("detach: give DEVICE or FILE arguments, or --all");
  if (geteuid () != 0)
    return detach_through_service (all, argc, argv);
  if (all) {
    list = mloop_state_list (&n);
    r = detach_list (list, n);
    g_free (list);
    mloop_cleanup_incomplete ();
    return r;
  }
  for (int i = 1; i < argc; i++) {
    if (mloop_lookup (argv[i], &st, err, sizeof err) == -1)
      r = error ("detach: %s", err);
    else if (detach_one (&st) != EXIT_SUCCESS)
      r = EXIT_FAILURE;
  }
  return r;
}

static int
cmd_resize (int argc, char **argv)
{
  g_autofree char *size_text = NULL;
  GOptionEntry entries[] = {
    { "size", 0, 0, G_OPTION_ARG_STRING, &size_text,
      "Grow (or shrink) the image file to N bytes first "
      "(suffixes K, M, G, T)", "N" },
    G_OPTION_ENTRY_NULL
  };
  struct mloop_device_state st;
  uint64_t size = 0;
  char err[1024];
  int r = EXIT_SUCCESS;

  if (!parse ("DEVICE|FILE", "Give a device its image's new size (or "
              "resize the image with --size) while it runs, like "
              "losetup -c.", entries, &argc, &argv))
    return EXIT_FAILURE;
  if (argc != 2)
    return error ("resize: give one DEVICE or FILE");
  if (size_text && mloop_size_parse (size_text, &size) < 0)
    return error ("resize: --size %s: not a size (bytes, or with a K, M, G "
                  "or T suffix)", size_text);
  if (geteuid () != 0)
    return error ("resize: needs root");
  if (mloop_lookup (argv[1], &st, err, sizeof err) == -1)
    return error ("resize: %s", err);
  if (mloop_resize (&st, size_text != NULL, size, err, sizeof err) == -1) {
    g_autofree char *dev = mloop_state_device_path (&st);

    r = error ("resize %s: %s", dev, err);
  }
  mloop_state_clear (&st);
  return r;
}

static int
cmd_list (int argc, char **argv)
{
  gboolean json = FALSE;
  GOptionEntry entries[] = {
    { "json", 'J', 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL },
    G_OPTION_ENTRY_NULL
  };
  const struct mloop_cli_extras *extras;
  struct mloop_device_state *list;
  size_t n;

  if (!parse ("", "List attached devices, like losetup --list.", entries,
              &argc, &argv))
    return EXIT_FAILURE;
  if (argc != 1)
    return error ("list: takes no arguments");
  if ((extras = mloop_cli_extras_load ()) == NULL)
    return EXIT_FAILURE;
  /* The runtime directory is root's: a user asks the service. */
  if (geteuid () != 0) {
    g_autofree char *text = NULL;
    char err[1024];

    if (extras->service_list (json, &text, err, sizeof err) == -1)
      return error ("list: %s", err);
    fputs (text, stdout);
    return EXIT_SUCCESS;
  }
  list = mloop_state_list (&n);
  extras->describe_list (stdout, list, n, json);
  mloop_state_free_list (list, n);
  return EXIT_SUCCESS;
}

static int
cmd_status (int argc, char **argv)
{
  gboolean json = FALSE;
  GOptionEntry entries[] = {
    { "json", 'J', 0, G_OPTION_ARG_NONE, &json, "Print JSON", NULL },
    G_OPTION_ENTRY_NULL
  };
  const struct mloop_cli_extras *extras;
  struct mloop_device_state st;
  struct mloop_device_status status;
  char err[1024];

  if (!parse ("DEVICE|FILE", "Show a device's connections and counters.",
              entries, &argc, &argv))
    return EXIT_FAILURE;
  if (argc != 2)
    return error ("status: give one DEVICE or FILE");
  /* The runtime directory is root's (a user's list asks mloop-dbus). */
  if (geteuid () != 0)
    return error ("status: needs root (mloop list shows every device)");
  if ((extras = mloop_cli_extras_load ()) == NULL)
    return EXIT_FAILURE;
  if (mloop_lookup (argv[1], &st, err, sizeof err) == -1)
    return error ("status: %s", err);
  mloop_device_status_read (&st, &status);
  extras->describe_status (stdout, &st, &status, json);
  mloop_state_clear (&st);
  return EXIT_SUCCESS;
}

static int
cmd_serve (int argc, char **argv)
{
  gboolean read_only = FALSE, verify_peer = FALSE;
  gint threads = -1, max_connections = 0, max_per_client = 0;
  g_autofree char *listen = NULL, *export_name = NULL, *tls = NULL;
  g_autofree char *psk = NULL, *certs = NULL, *server = NULL;
  g_autofree char *offset = NULL, *sizelimit = NULL, *keepalive = NULL;
  g_autofree char *ceph_conf = NULL, *ceph_id = NULL, *name = NULL;
  GOptionEntry entries[] = {
    { "listen", 'l', 0, G_OPTION_ARG_STRING, &listen,
      "unix:PATH or tcp:HOST:PORT (only that address)", "ADDR" },
    { "read-only", 'r', 0, G_OPTION_ARG_NONE, &read_only,
      "Serve read-only", NULL },
    { "export-name", 'e', 0, G_OPTION_ARG_STRING, &export_name,
      "The export's name (default \"\")", "NAME" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads,
      "Server IO workers (default 4)", "N" },
    { "tls", 0, 0, G_OPTION_ARG_STRING, &tls,
      "off (default), on or require", "MODE" },
    { "tls-psk", 0, 0, G_OPTION_ARG_FILENAME, &psk,
      "Pre-shared keys file (nbdkit's format: user:hexkey)", "FILE" },
    { "tls-certificates", 0, 0, G_OPTION_ARG_FILENAME, &certs,
      "Directory with ca-cert.pem, server-cert.pem, server-key.pem", "DIR" },
    { "tls-verify-peer", 0, 0, G_OPTION_ARG_NONE, &verify_peer,
      "Clients must show a certificate signed by the CA (ca-cert.pem)",
      NULL },
    { "server", 's', 0, G_OPTION_ARG_STRING, &server,
      "native (default) or nbdkit", "KIND" },
    { "offset", 'o', 0, G_OPTION_ARG_STRING, &offset,
      "Start this many bytes into FILE (like losetup)", "SIZE" },
    { "sizelimit", 0, 0, G_OPTION_ARG_STRING, &sizelimit,
      "Serve at most this many bytes of FILE (like losetup)", "SIZE" },
    { "max-connections", 0, 0, G_OPTION_ARG_INT, &max_connections,
      "Connections open at once; beyond, new ones are closed (default 0: "
      "no cap)", "N" },
    { "max-connections-per-client", 0, 0, G_OPTION_ARG_INT, &max_per_client,
      "Connections open at once from one client address (native server; "
      "default 0: no cap)", "N" },
    { "keepalive", 0, 0, G_OPTION_ARG_STRING, &keepalive,
      "TCP keepalive IDLE:INTERVAL:COUNT seconds, or off (native server; "
      "default 30:10:3)", "SPEC" },
    MLOOP_CEPH_OPTION_ENTRIES (ceph_conf, ceph_id),
    G_OPTION_ENTRY_NULL
  };
  struct mloop_serve_request req = { 0 };
  char err[1024];
  char **cmd;

  if (!parse ("FILE|rbd:POOL/IMAGE[@SNAP]",
              "Serve FILE or an RBD image over NBD to other machines "
              "(foreground).",
              entries, &argc, &argv))
    return EXIT_FAILURE;
  if (argc != 2)
    return error ("serve: give exactly one FILE (see mloop serve --help)");
  if (threads != -1 && (threads < 1 || threads > 64))
    return error ("serve: --threads %d: must be 1..64", threads);
  if (tls && mloop_tls_mode_parse (tls, &req.tls) == -1)
    return error ("serve: --tls %s: must be off, on or require", tls);
  if (max_connections < 0 || max_per_client < 0)
    return error ("serve: --max-connections%s %d: must be 0 (no cap) or more",
                  max_connections < 0 ? "" : "-per-client",
                  max_connections < 0 ? max_connections : max_per_client);
  if (server &&
      (req.server = mloop_server_kind_find (server, err, sizeof err)) == NULL)
    return error ("serve: --server %s", err);
  if (!parse_window ("serve", offset, sizelimit, &req.offset, &req.sizelimit))
    return EXIT_FAILURE;
  if (!ceph_name ("serve", argv[1], ceph_conf, ceph_id, &name))
    return EXIT_FAILURE;
  req.file = name;
  req.listen = listen;
  req.export_name = export_name;
  req.read_only = read_only;
  req.threads = threads == -1 ? 0 : threads;
  req.max_connections = (unsigned) max_connections;
  req.max_per_client = (unsigned) max_per_client;
  req.keepalive = keepalive;
  req.tls_psk = psk;
  req.tls_certificates = certs;
  req.tls_verify_peer = verify_peer;

  cmd = mloop_serve_command (&req, err, sizeof err);
  if (cmd == NULL)
    return error ("serve %s: %s", req.file, err);
  /* The socket the server creates is then 0600 (its directory, if we
   * made it, is 0700).
   */
  umask (0177);
  execvp (cmd[0], cmd);
  return error ("serve: cannot run %s: %s", cmd[0], strerror (errno));
}

static const struct {
  const char *name;
  int (*run) (int argc, char **argv);
  const char *help;
} commands[] = {
  { "attach", cmd_attach, "attach FILE as /dev/nbdN" },
  { "detach", cmd_detach, "detach DEVICE|FILE, or --all" },
  { "resize", cmd_resize, "give DEVICE|FILE its image's new size" },
  { "list", cmd_list, "list attached devices" },
  { "status", cmd_status, "connections and counters of a device" },
  { "serve", cmd_serve, "serve FILE to other machines (TCP, TLS)" },
  { "mount", mloop_cmd_mount, "attach FILE and mount it (autoclear)" },
  { "umount", mloop_cmd_umount, "unmount DIR and detach its device" },
  { "overlay", mloop_cmd_overlay, "commit, discard, adopt or clear an overlay file" },
};

static int
usage (FILE *f, int status)
{
  fprintf (f, "Usage: mloop COMMAND [OPTION...]\n\nCommands:\n");
  for (size_t i = 0; i < G_N_ELEMENTS (commands); i++)
    fprintf (f, "  %-8s %s\n", commands[i].name, commands[i].help);
  fprintf (f, "\n'mloop COMMAND --help' describes a command's options.\n");
  return status;
}

int
main (int argc, char **argv)
{
  g_autofree char *name = g_path_get_basename (argv[0]);

  if (strcmp (name, "mount.mloop") == 0)
    return mloop_cmd_mount (argc, argv);
  if (argc < 2)
    return usage (stderr, EXIT_FAILURE);
  if (strcmp (argv[1], "--help") == 0 || strcmp (argv[1], "-h") == 0)
    return usage (stdout, EXIT_SUCCESS);
  if (strcmp (argv[1], "--version") == 0 || strcmp (argv[1], "-V") == 0) {
    printf ("mloop %s\n", PACKAGE_VERSION);
    return EXIT_SUCCESS;
  }
  for (size_t i = 0; i < G_N_ELEMENTS (commands); i++)
    if (strcmp (argv[1], commands[i].name) == 0) {
      /* The command parses its own options; argv[0] names it in --help. */
      argv[1] = g_strdup_printf ("mloop %s", argv[1]);
      return commands[i].run (argc - 1, argv + 1);
    }
  return error ("unknown command '%s' (see mloop --help)", argv[1]);
}
