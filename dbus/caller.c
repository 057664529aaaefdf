/* mloop — who calls mloop's D-Bus service (caller.h), through
 * libpolkit-gobject: polkit's own client library, which knows how to
 * name a bus caller to polkitd and read its answer.
 */
#include <stdarg.h>
#include <stdio.h>

#include <polkit/polkit.h>

#include "caller.h"

static int
fail (char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (err, errlen, fmt, ap);
  va_end (ap);
  return -1;
}

int
mloop_caller_uid (GDBusMethodInvocation *invocation, uid_t *uid, char *err,
                  size_t errlen)
{
  const char *sender = g_dbus_method_invocation_get_sender (invocation);
  g_autoptr (PolkitSubject) subject = polkit_system_bus_name_new (sender);
  g_autoptr (PolkitUnixUser) user = NULL;
  g_autoptr (GError) gerr = NULL;

  user = polkit_system_bus_name_get_user_sync (POLKIT_SYSTEM_BUS_NAME
                                               (subject), NULL, &gerr);
  if (user == NULL)
    return fail (err, errlen, "cannot tell which user %s is: %s", sender,
                 gerr->message);
  *uid = (uid_t) polkit_unix_user_get_uid (user);
  return 0;
}

int
mloop_caller_authorize (GDBusMethodInvocation *invocation,
                        const char *action, char *err, size_t errlen)
{
  const char *sender = g_dbus_method_invocation_get_sender (invocation);
  GDBusMessage *msg = g_dbus_method_invocation_get_message (invocation);
  g_autoptr (PolkitSubject) subject = polkit_system_bus_name_new (sender);
  g_autoptr (PolkitAuthority) authority = NULL;
  g_autoptr (PolkitAuthorizationResult) result = NULL;
  g_autoptr (GError) gerr = NULL;
  PolkitCheckAuthorizationFlags flags =
    POLKIT_CHECK_AUTHORIZATION_FLAGS_NONE;

  if (g_dbus_message_get_flags (msg) &
      G_DBUS_MESSAGE_FLAGS_ALLOW_INTERACTIVE_AUTHORIZATION)
    flags = POLKIT_CHECK_AUTHORIZATION_FLAGS_ALLOW_USER_INTERACTION;
  authority = polkit_authority_get_sync (NULL, &gerr);
  if (authority)
    result = polkit_authority_check_authorization_sync (authority, subject,
                                                        action, NULL, flags,
                                                        NULL, &gerr);
  if (result == NULL)
    return fail (err, errlen, "cannot ask polkit whether you may (%s): %s",
                 action, gerr->message);
  if (!polkit_authorization_result_get_is_authorized (result))
    return fail (err, errlen, "not authorized: polkit refused %s%s", action,
                 polkit_authorization_result_get_is_challenge (result)
                 ? " (it needs an administrator's authentication)" : "");
  return 0;
}
