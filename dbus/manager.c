/* mloop — org.mloop.Manager1, the object of mloop's D-Bus service
 * (manager.h).  Each call is served to its end before the next: an
 * attach takes a second or two, and one at a time keeps the process
 * simple (the device library locks per device anyway).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <gio/gunixfdlist.h>

#include "attach.h"
#include "caller.h"
#include "describe.h"
#include "manager.h"

#define ERROR_FAILED "org.mloop.Error.Failed"
#define ERROR_NOT_AUTHORIZED "org.mloop.Error.NotAuthorized"
#define ERROR_INVALID "org.mloop.Error.InvalidArgs"

/* The descriptor at HANDLE in INVOCATION's message, a duplicate owned by
 * the caller of this; -1 with ERR.
 */
static int
passed_fd (GDBusMethodInvocation *invocation, gint32 handle, char *err,
           size_t errlen)
{
  GDBusMessage *msg = g_dbus_method_invocation_get_message (invocation);
  GUnixFDList *fds = g_dbus_message_get_unix_fd_list (msg);
  g_autoptr (GError) gerr = NULL;
  int fd;

  if (fds == NULL) {
    snprintf (err, errlen, "no descriptor was passed with the call");
    return -1;
  }
  fd = g_unix_fd_list_get (fds, handle, &gerr);
  if (fd == -1)
    snprintf (err, errlen, "descriptor %d: %s", handle, gerr->message);
  return fd;
}

static gboolean
option (GVariant *options, const char *name)
{
  gboolean value = FALSE;

  g_variant_lookup (options, name, "b", &value);
  return value;
}

/* The options Attach knows; false with ERR naming one it does not. */
static bool
options_known (GVariant *options, char *err, size_t errlen)
{
  static const char *const known[] = {
    "read-only", "no-partscan", "autoclear", NULL,
  };
  GVariantIter iter;
  const char *key;
  GVariant *value;

  g_variant_iter_init (&iter, options);
  while (g_variant_iter_next (&iter, "{&sv}", &key, &value)) {
    bool ok = g_strv_contains (known, key) &&
      g_variant_is_of_type (value, G_VARIANT_TYPE_BOOLEAN);

    g_variant_unref (value);
    if (!ok) {
      snprintf (err, errlen, "unknown option %s (read-only, no-partscan "
                "and autoclear are booleans)", key);
      return false;
    }
  }
  return true;
}

static void
attach (GDBusMethodInvocation *invocation, GVariant *params)
{
  g_autoptr (GVariant) options = NULL;
  struct mloop_device_state st;
  g_autofree char *device = NULL;
  const char *name;
  gint32 handle;
  char err[1024];
  uid_t uid;
  int fd;

  g_variant_get (params, "(h&s@a{sv})", &handle, &name, &options);
  if (!options_known (options, err, sizeof err)) {
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_INVALID,
                                                err);
    return;
  }
  if (mloop_caller_authorize (invocation, MLOOP_ACTION_ATTACH, err,
                              sizeof err) == -1) {
    g_dbus_method_invocation_return_dbus_error (invocation,
                                                ERROR_NOT_AUTHORIZED, err);
    return;
  }
  if (mloop_caller_uid (invocation, &uid, err, sizeof err) == -1 ||
      (fd = passed_fd (invocation, handle, err, sizeof err)) == -1) {
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                err);
    return;
  }

  const struct mloop_attach_request req = {
    .file = name, .has_image_fd = true, .image_fd = fd, .owner = uid,
    .index = -1, .transport = MLOOP_CHOOSE_NBD,
    .read_only = option (options, "read-only"),
    .no_partscan = option (options, "no-partscan"),
    .autoclear = option (options, "autoclear"),
  };
  int r = mloop_attach (&req, &st, err, sizeof err);

  close (fd);
  if (r == -1) {
    g_message ("uid %u: attach %s refused: %s", (unsigned) uid, name, err);
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                err);
    return;
  }
  device = mloop_state_device_path (&st);
  g_message ("uid %u: attached %s as %s", (unsigned) uid, name, device);
  mloop_state_clear (&st);
  g_dbus_method_invocation_return_value (invocation,
                                         g_variant_new ("(s)", device));
}

static void
detach (GDBusMethodInvocation *invocation, GVariant *params)
{
  struct mloop_device_state st;
  g_autofree char *device = NULL;
  const char *what;
  char err[1024];
  uid_t uid;

  g_variant_get (params, "(&s)", &what);
  if (mloop_caller_uid (invocation, &uid, err, sizeof err) == -1) {
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                err);
    return;
  }
  if (mloop_lookup (what, &st, err, sizeof err) == -1) {
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_INVALID,
                                                err);
    return;
  }
  device = mloop_state_device_path (&st);
  /* Another user's device: only with the stronger action, so "not your
   * device" is what a user without it hears.
   */
  if (mloop_caller_authorize (invocation, st.owner == uid
                              ? MLOOP_ACTION_DETACH
                              : MLOOP_ACTION_DETACH_OTHER,
                              err, sizeof err) == -1) {
    if (st.owner != uid)
      snprintf (err, sizeof err, "%s is not your device (attached by uid "
                "%u), and polkit refused %s", device, (unsigned) st.owner,
                MLOOP_ACTION_DETACH_OTHER);
    g_dbus_method_invocation_return_dbus_error (invocation,
                                                ERROR_NOT_AUTHORIZED, err);
  }
  else if (mloop_detach (&st, err, sizeof err) == -1)
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                err);
  else {
    g_message ("uid %u: detached %s", (unsigned) uid, device);
    g_dbus_method_invocation_return_value (invocation, NULL);
  }
  mloop_state_clear (&st);
}

static void
list (GDBusMethodInvocation *invocation, GVariant *params)
{
  struct mloop_device_state *devices;
  g_autofree char *text = NULL;
  gboolean json;
  size_t n, size;
  FILE *f;

  g_variant_get (params, "(b)", &json);
  devices = mloop_state_list (&n);
  f = open_memstream (&text, &size);
  if (f)
    mloop_describe_list (f, devices, n, json);
  mloop_state_free_list (devices, n);
  if (f == NULL || fclose (f) != 0) {
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                strerror (errno));
    return;
  }
  g_dbus_method_invocation_return_value (invocation,
                                         g_variant_new ("(s)", text));
}

static void
method_call (GDBusConnection *connection, const char *sender,
             const char *path, const char *interface, const char *method,
             GVariant *params, GDBusMethodInvocation *invocation,
             gpointer unused)
{
  if (strcmp (method, "Attach") == 0)
    attach (invocation, params);
  else if (strcmp (method, "Detach") == 0)
    detach (invocation, params);
  else if (strcmp (method, "List") == 0)
    list (invocation, params);
  else
    g_dbus_method_invocation_return_dbus_error (invocation,
                                                ERROR_INVALID,
                                                "no such method");
}

bool
mloop_manager_export (GDBusConnection *connection)
{
  static const GDBusInterfaceVTable vtable = { .method_call = method_call };
  g_autoptr (GBytes) xml = NULL;
  g_autoptr (GDBusNodeInfo) node = NULL;
  g_autoptr (GError) gerr = NULL;

  xml = g_resources_lookup_data ("/org/mloop/org.mloop.Manager1.xml", 0,
                                 &gerr);
  if (xml)
    node = g_dbus_node_info_new_for_xml (g_bytes_get_data (xml, NULL),
                                         &gerr);
  if (node == NULL ||
      g_dbus_connection_register_object (connection, MLOOP_DBUS_PATH,
                                         node->interfaces[0], &vtable,
                                         NULL, NULL, &gerr) == 0) {
    g_warning ("cannot export %s: %s", MLOOP_DBUS_PATH, gerr->message);
    return false;
  }
  return true;
}
