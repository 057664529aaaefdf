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
#include <sys/wait.h>

#include <gio/gio.h>
#include <glib-unix.h>

#include "manager.h"

/* How often exited supervisors are reaped, seconds: each attach forks
 * one, which exits at its device's detach.
 */
#define REAP_INTERVAL_S 5

static GMainLoop *loop;
static int status = EXIT_SUCCESS;

static void
on_bus (GDBusConnection *connection, const char *name, gpointer unused)
{
  if (!mloop_manager_export (connection)) {
    status = EXIT_FAILURE;
    g_main_loop_quit (loop);
  }
}

static void
on_name_lost (GDBusConnection *connection, const char *name,
              gpointer unused)
{
  g_printerr ("mloop-dbus: cannot own %s on the system bus (%s)\n", name,
              connection ? "another owner, or the bus's policy refuses us"
              : "no system bus");
  status = EXIT_FAILURE;
  g_main_loop_quit (loop);
}

static gboolean
on_stop (gpointer unused)
{
  g_main_loop_quit (loop);
  return G_SOURCE_REMOVE;
}

/* Between calls only: an attach in progress waits for its own children. */
static gboolean
reap (gpointer unused)
{
  while (waitpid (-1, NULL, WNOHANG) > 0)
    ;
  return G_SOURCE_CONTINUE;
}

int
main (int argc, char **argv)
{
  guint owner;

  /* The bus starts us with an empty environment; servers, supervisors
   * and modprobe are found on this path.
   */
  g_setenv ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:"
            "/sbin:/bin", FALSE);
  signal (SIGPIPE, SIG_IGN);
  loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop, NULL);
  g_unix_signal_add (SIGINT, on_stop, NULL);
  g_timeout_add_seconds (REAP_INTERVAL_S, reap, NULL);
  owner = g_bus_own_name (G_BUS_TYPE_SYSTEM, MLOOP_DBUS_NAME,
                          G_BUS_NAME_OWNER_FLAGS_NONE, on_bus, NULL,
                          on_name_lost, NULL, NULL);
  g_main_loop_run (loop);
  g_bus_unown_name (owner);
  return status;
}
