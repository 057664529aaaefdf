/* mloop — a user's attach, detach and list through mloop's D-Bus
 * service (service_client.h), with GDBus.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <gio/gunixfdlist.h>

#include "service_client.h"

#define NAME "org.mloop.Manager1"
#define PATH "/org/mloop/Manager1"
#define INTERFACE "org.mloop.Manager1"
/* An attach under emulation takes seconds; polkit may wait for the user
 * to authenticate.
 */
#define CALL_TIMEOUT_MS (120 * 1000)

/* The service's own words without GDBus's "GDBus.Error:NAME: " prefix. */
static int
call_failed (GError *gerr, char *err, size_t errlen)
{
  if (g_dbus_error_is_remote_error (gerr) &&
      g_dbus_error_get_remote_error (gerr) &&
      g_str_has_prefix (g_dbus_error_get_remote_error (gerr), "org.mloop.")) {
    g_dbus_error_strip_remote_error (gerr);
    snprintf (err, errlen, "%s", gerr->message);
  }
  else {
    g_dbus_error_strip_remote_error (gerr);
    snprintf (err, errlen, "mloop's D-Bus service (%s, for users who are "
              "not root) cannot be reached: %s", NAME, gerr->message);
  }
  return -1;
}

/* Calls METHOD with PARAMS (and FDS); its reply in *REPLY. */
static int
call (const char *method, GVariant *params, const GVariantType *reply_type,
      GUnixFDList *fds, GVariant **reply, char *err, size_t errlen)
{
  g_autoptr (GDBusConnection) bus = NULL;
  g_autoptr (GError) gerr = NULL;

  bus = g_bus_get_sync (G_BUS_TYPE_SYSTEM, NULL, &gerr);
  if (bus)
    *reply = g_dbus_connection_call_with_unix_fd_list_sync
      (bus, NAME, PATH, INTERFACE, method, params, reply_type,
       G_DBUS_CALL_FLAGS_ALLOW_INTERACTIVE_AUTHORIZATION, CALL_TIMEOUT_MS,
       fds, NULL, NULL, &gerr);
  else
    g_variant_unref (g_variant_ref_sink (params));
  if (bus == NULL || *reply == NULL)
    return call_failed (gerr, err, errlen);
  return 0;
}

int
mloop_service_attach (const struct mloop_service_attach *req, char **device,
                      char *err, size_t errlen)
{
  g_autofree char *path = g_canonicalize_filename (req->file, NULL);
  /* Only a label (the service never opens it), and a D-Bus string is
   * UTF-8: a name in another encoding goes with what is not UTF-8 as
   * U+FFFD.
   */
  g_autofree char *name = g_utf8_make_valid (path, -1);
  g_autoptr (GUnixFDList) fds = g_unix_fd_list_new ();
  g_autoptr (GVariant) reply = NULL;
  g_autoptr (GError) gerr = NULL;
  GVariantBuilder options;
  int fd, handle;

  /* The kernel decides here, as this user, what the device may do. */
  fd = open (req->file, (req->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1 && !req->read_only && (errno == EACCES || errno == EROFS)) {
    snprintf (err, errlen, "%s: %s (use --read-only to attach it "
              "read-only)", req->file, strerror (errno));
    return -1;
  }
  if (fd == -1) {
    snprintf (err, errlen, "%s: %s", req->file, strerror (errno));
    return -1;
  }
  handle = g_unix_fd_list_append (fds, fd, &gerr);
  close (fd);
  if (handle == -1) {
    snprintf (err, errlen, "%s: %s", req->file, gerr->message);
    return -1;
  }
  g_variant_builder_init (&options, G_VARIANT_TYPE_VARDICT);
  g_variant_builder_add (&options, "{sv}", "read-only",
                         g_variant_new_boolean (req->read_only));
  g_variant_builder_add (&options, "{sv}", "no-partscan",
                         g_variant_new_boolean (req->no_partscan));
  g_variant_builder_add (&options, "{sv}", "autoclear",
                         g_variant_new_boolean (req->autoclear));
  if (call ("Attach", g_variant_new ("(hsa{sv})", handle, name, &options),
            G_VARIANT_TYPE ("(s)"), fds, &reply, err, errlen) == -1)
    return -1;
  g_variant_get (reply, "(s)", device);
  return 0;
}

int
mloop_service_detach (const char *device, char *err, size_t errlen)
{
  g_autoptr (GVariant) reply = NULL;

  /* The service looks for a path as it is named, and can only be sent
   * UTF-8.
   */
  if (!g_utf8_validate (device, -1, NULL)) {
    snprintf (err, errlen, "the name is not UTF-8, which the service "
              "cannot be sent: detach the device (mloop list names it)");
    return -1;
  }
  return call ("Detach", g_variant_new ("(s)", device), NULL, NULL, &reply,
               err, errlen);
}

int
mloop_service_list (bool json, char **text, char *err, size_t errlen)
{
  g_autoptr (GVariant) reply = NULL;

  if (call ("List", g_variant_new ("(b)", json), G_VARIANT_TYPE ("(s)"),
            NULL, &reply, err, errlen) == -1)
    return -1;
  g_variant_get (reply, "(s)", text);
  return 0;
}
