/* mloop-dbus — mloop's system D-Bus service: attaches images for users
 * who are not root, as udisks does for loop devices.  The caller passes
 * the image as a descriptor it opened, polkit decides whether the caller
 * may attach at all, and each device records who attached it
 * (manager.h has the interface; docs/design.md the security review).
 *
 * Started by the bus (activation through systemd's mloop-dbus.service,
 * or by dbus-daemon itself without systemd), never by hand.  The devices
 * it attaches do not depend on it: each has its own supervisor and
 * server, which outlive it.
 */
#include <signal.h>
#include <stdlib.h>

#include <gio/gio.h>
#include <glib-unix.h>

#include "descriptors.h"
#include "manager.h"
#include "nbd_netlink.h"
#include "refusal_log.h"

/* How often exited supervisors are reaped, seconds (manager.h). */
#define REAP_INTERVAL_S 5

static GMainLoop *loop;
static int status = EXIT_SUCCESS;
static struct mloop_manager_limits limits = {
  .max_devices_per_user = MLOOP_DEFAULT_MAX_DEVICES_PER_USER,
  .authorization_timeout_s = MLOOP_DEFAULT_AUTHORIZATION_TIMEOUT_S,
};

static void
on_name_lost (GDBusConnection *connection, const char *name,
              gpointer unused)
{
  g_printerr ("mloop-dbus: cannot own %s on the system bus (another "
              "owner, or the bus's policy refuses us)\n", name);
  status = EXIT_FAILURE;
  g_main_loop_quit (loop);
}

static gboolean
on_stop (gpointer unused)
{
  g_main_loop_quit (loop);
  return G_SOURCE_REMOVE;
}

static gboolean
reap (gpointer unused)
{
  mloop_manager_reap ();
  return G_SOURCE_CONTINUE;
}

/* A whole number from MIN up for OPTION, into *OUT: false after saying
 * what is wrong.
 */
static bool
parse_count (const char *option, const char *text, unsigned min,
             unsigned *out)
{
  guint64 value;
  g_autoptr (GError) gerr = NULL;

  if (!g_ascii_string_to_unsigned (text, 10, min, G_MAXUINT, &value,
                                   &gerr)) {
    g_printerr ("mloop-dbus: %s %s: %s\n", option, text, gerr->message);
    return false;
  }
  *out = (unsigned) value;
  return true;
}

static bool
parse_options (int argc, char **argv)
{
  g_autofree char *max_devices = NULL, *timeout = NULL;
  const GOptionEntry entries[] = {
    { "max-devices-per-user", 0, 0, G_OPTION_ARG_STRING, &max_devices,
      "devices one user (not root) may have attached at once", "N" },
    { "authorization-timeout", 0, 0, G_OPTION_ARG_STRING, &timeout,
      "seconds a call waits for polkit's answer", "SECONDS" },
    { NULL },
  };
  g_autoptr (GOptionContext) context =
    g_option_context_new ("- attach images for users (D-Bus service)");
  g_autoptr (GError) gerr = NULL;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &gerr)) {
    g_printerr ("mloop-dbus: %s\n", gerr->message);
    return false;
  }
  if (argc > 1) {
    g_printerr ("mloop-dbus: unexpected argument %s\n", argv[1]);
    return false;
  }
  return (max_devices == NULL ||
          parse_count ("--max-devices-per-user", max_devices, 0,
                       &limits.max_devices_per_user)) &&
    (timeout == NULL ||
     parse_count ("--authorization-timeout", timeout, 1,
                  &limits.authorization_timeout_s));
}

int
main (int argc, char **argv)
{
  g_autoptr (GDBusConnection) connection = NULL;
  g_autoptr (GError) gerr = NULL;
  guint owner;

  if (!parse_options (argc, argv))
    return EXIT_FAILURE;

  /* The bus starts us with an empty environment; servers, supervisors
   * and modprobe are found on this path.
   */
  g_setenv ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
            "/sbin:/bin", FALSE);
  signal (SIGPIPE, SIG_IGN);
  /* The nbd module, loaded now if it is not there: a process started
   * once callers' descriptors are here closes its copy of each at its
   * exec, and waits there for as long as a caller's FUSE server likes
   * (descriptors.h); the device thread, which every attach waits for,
   * must never wait for one.  Later attaches only look for the module.
   */
  mloop_nbd_netlink_load_early ();
  loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop, NULL);
  g_unix_signal_add (SIGINT, on_stop, NULL);
  g_timeout_add_seconds (REAP_INTERVAL_S, reap, NULL);
  /* The bus's connection, shared with polkit's proxy (GDBus makes one
   * per bus), takes callers' descriptors out of what it receives before
   * the object is there to call or the name is asked for
   * (descriptors.h).  Only the moment between the bus's answer to
   * Hello and the filter is left, for a signal sent to the unique name
   * before anyone could know it is this service's.
   */
  connection = g_bus_get_sync (G_BUS_TYPE_SYSTEM, NULL, &gerr);
  if (connection == NULL) {
    g_printerr ("mloop-dbus: cannot own %s on the system bus (no system "
                "bus: %s)\n", MLOOP_DBUS_NAME, gerr->message);
    return EXIT_FAILURE;
  }
  mloop_descriptors_take (connection);
  if (!mloop_manager_export (connection, &limits))
    return EXIT_FAILURE;
  owner = g_bus_own_name_on_connection (connection, MLOOP_DBUS_NAME,
                                        G_BUS_NAME_OWNER_FLAGS_NONE, NULL,
                                        on_name_lost, NULL, NULL);
  g_main_loop_run (loop);
  /* What the log was spared is said before the service goes. */
  mloop_refusal_log_flush ();
  g_bus_unown_name (owner);
  /* Off the bus now: a close waiting on a user's FUSE server keeps this
   * process, and its descriptors, the bus's among them, until that
   * server answers or goes (the kernel waits for it uninterruptibly),
   * and a name still owned here would not be given to a new service.
   */
  g_dbus_connection_close_sync (connection, NULL, NULL);
  return status;
}
