/* mloop — who calls mloop's D-Bus service (caller.h), through
 * libpolkit-gobject: polkit's own client library, which knows how to
 * name a bus caller to polkitd and read its answer.
 *
 * Thread model: everything here runs in the main loop's thread; an
 * authorization in progress is a pending call to polkitd, not a thread.
 */
#include <stdio.h>

#include <polkit/polkit.h>

#include "caller.h"

/* One lookup of a caller's user in progress. */
struct lookup {
  GDBusMethodInvocation *invocation;
  mloop_caller_uid_fn done;
  gpointer data;
};

static void
uid_answered (GObject *source, GAsyncResult *res, gpointer data)
{
  struct lookup *l = data;
  const char *sender = g_dbus_method_invocation_get_sender (l->invocation);
  g_autoptr (GVariant) reply = NULL;
  g_autoptr (GError) gerr = NULL;
  g_autofree char *err = NULL;
  guint32 uid = 0;

  reply = g_dbus_connection_call_finish (G_DBUS_CONNECTION (source), res,
                                         &gerr);
  if (reply == NULL) {
    g_dbus_error_strip_remote_error (gerr);
    err = g_strdup_printf ("cannot tell which user %s is: %s", sender,
                           gerr->message);
  }
  else
    g_variant_get (reply, "(u)", &uid);
  l->done (l->invocation, (uid_t) uid, err, l->data);
  g_object_unref (l->invocation);
  g_free (l);
}

void
mloop_caller_uid (GDBusMethodInvocation *invocation, unsigned timeout_ms,
                  mloop_caller_uid_fn done, gpointer data)
{
  struct lookup *l = g_new0 (struct lookup, 1);

  l->invocation = g_object_ref (invocation);
  l->done = done;
  l->data = data;
  /* Answered by the bus daemon itself, never by a user. */
  g_dbus_connection_call (g_dbus_method_invocation_get_connection
                          (invocation), "org.freedesktop.DBus",
                          "/org/freedesktop/DBus", "org.freedesktop.DBus",
                          "GetConnectionUnixUser",
                          g_variant_new ("(s)", g_dbus_method_invocation_get_sender
                                         (invocation)),
                          G_VARIANT_TYPE ("(u)"), G_DBUS_CALL_FLAGS_NONE,
                          (int) timeout_ms, NULL, uid_answered, l);
}

/* One authorization in progress. */
struct check {
  GDBusMethodInvocation *invocation;
  char *action;
  unsigned timeout_s;
  GCancellable *cancel;
  guint timer;
  bool timed_out;
  mloop_authorized_fn done;
  gpointer data;
};

static void
check_finish (struct check *c, const char *err)
{
  if (c->timer)
    g_source_remove (c->timer);
  c->done (c->invocation, err, c->data);
  g_object_unref (c->invocation);
  g_object_unref (c->cancel);
  g_free (c->action);
  g_free (c);
}

/* polkitd has not answered: cancelling the check makes the client
 * library tell polkitd, which dismisses the caller's dialog.
 */
static gboolean
check_timed_out (gpointer data)
{
  struct check *c = data;

  c->timer = 0;
  c->timed_out = true;
  g_cancellable_cancel (c->cancel);
  return G_SOURCE_REMOVE;
}

static void
check_answered (GObject *source, GAsyncResult *res, gpointer data)
{
  struct check *c = data;
  g_autoptr (PolkitAuthorizationResult) result = NULL;
  g_autoptr (GError) gerr = NULL;
  g_autofree char *err = NULL;

  result = polkit_authority_check_authorization_finish
    (POLKIT_AUTHORITY (source), res, &gerr);
  if (result == NULL && c->timed_out)
    err = g_strdup_printf ("not authorized: polkit did not answer for %s "
                           "within %u s (an authentication left waiting?)",
                           c->action, c->timeout_s);
  else if (result == NULL)
    err = g_strdup_printf ("cannot ask polkit whether you may (%s): %s",
                           c->action, gerr->message);
  else if (!polkit_authorization_result_get_is_authorized (result))
    err = g_strdup_printf ("not authorized: polkit refused %s%s", c->action,
                           polkit_authorization_result_get_is_challenge
                           (result) ? " (it needs an administrator's "
                           "authentication)" : "");
  check_finish (c, err);
}

void
mloop_caller_authorize (GDBusMethodInvocation *invocation,
                        const char *action, unsigned timeout_s,
                        mloop_authorized_fn done, gpointer data)
{
  const char *sender = g_dbus_method_invocation_get_sender (invocation);
  GDBusMessage *msg = g_dbus_method_invocation_get_message (invocation);
  g_autoptr (PolkitSubject) subject = polkit_system_bus_name_new (sender);
  /* Made once, at the first call: a proxy for polkitd, no round trip
   * that a user could hold up.
   */
  static PolkitAuthority *authority;
  PolkitCheckAuthorizationFlags flags =
    POLKIT_CHECK_AUTHORIZATION_FLAGS_NONE;
  struct check *c = g_new0 (struct check, 1);
  g_autoptr (GError) gerr = NULL;

  c->invocation = g_object_ref (invocation);
  c->action = g_strdup (action);
  c->timeout_s = timeout_s;
  c->cancel = g_cancellable_new ();
  c->done = done;
  c->data = data;
  if (authority == NULL)
    authority = polkit_authority_get_sync (NULL, &gerr);
  if (authority == NULL) {
    g_autofree char *err =
      g_strdup_printf ("cannot ask polkit whether you may (%s): %s", action,
                       gerr->message);

    check_finish (c, err);
    return;
  }
  if (g_dbus_message_get_flags (msg) &
      G_DBUS_MESSAGE_FLAGS_ALLOW_INTERACTIVE_AUTHORIZATION)
    flags = POLKIT_CHECK_AUTHORIZATION_FLAGS_ALLOW_USER_INTERACTION;
  c->timer = g_timeout_add_seconds (timeout_s, check_timed_out, c);
  polkit_authority_check_authorization (authority, subject, action, NULL,
                                        flags, c->cancel, check_answered, c);
}
