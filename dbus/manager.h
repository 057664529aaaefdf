/* mloop — the object mloop's D-Bus service exports: org.mloop.Manager1
 * at /org/mloop/Manager1 (org.mloop.Manager1.xml describes it).
 *
 *   Attach (h image, s name, a{sv} options) -> (s device)
 *       IMAGE: the image, opened by the caller (O_RDWR, or O_RDONLY with
 *       option "read-only"); NAME: its absolute path, recorded and shown,
 *       never opened.  Options: "read-only", "no-partscan", "autoclear"
 *       (booleans).  polkit action org.mloop.attach.
 *   Detach (s device)
 *       DEVICE (/dev/nbdN, or the image's name): org.mloop.detach for
 *       the user who attached it, org.mloop.detach-other for anyone else.
 *   List (b json) -> (s text)
 *       What `mloop list [--json]` prints as root.
 *
 * Refusals are D-Bus errors org.mloop.Error.* whose message is one line
 * naming the reason.
 */
#ifndef MLOOP_DBUS_MANAGER_H
#define MLOOP_DBUS_MANAGER_H

#include <stdbool.h>

#include <gio/gio.h>

#define MLOOP_DBUS_NAME "org.mloop.Manager1"
#define MLOOP_DBUS_PATH "/org/mloop/Manager1"
#define MLOOP_DBUS_INTERFACE "org.mloop.Manager1"

/* Exports the object on CONNECTION; false after logging why not. */
bool mloop_manager_export (GDBusConnection *connection);

#endif /* MLOOP_DBUS_MANAGER_H */
