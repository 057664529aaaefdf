/* mloop — who calls mloop's D-Bus service, and what polkit lets them do.
 *
 * The caller is named by its unique bus name; the bus daemon, not the
 * caller, says which user it runs as (polkit asks it), so a caller cannot
 * claim to be someone else.
 */
#ifndef MLOOP_DBUS_CALLER_H
#define MLOOP_DBUS_CALLER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <gio/gio.h>

/* The polkit actions (org.mloop.policy). */
#define MLOOP_ACTION_ATTACH "org.mloop.attach"
#define MLOOP_ACTION_DETACH "org.mloop.detach"
#define MLOOP_ACTION_DETACH_OTHER "org.mloop.detach-other"

/* The user INVOCATION's caller runs as: 0 and *UID, or -1 with ERR. */
int mloop_caller_uid (GDBusMethodInvocation *invocation, uid_t *uid,
                      char *err, size_t errlen);

/* Whether polkit lets INVOCATION's caller do ACTION: 0 when it does,
 * else -1 with ERR saying why not (polkit said no, or could not be
 * asked).  Asks the user to authenticate (through their polkit agent)
 * only when the caller allowed interactive authorization.
 */
int mloop_caller_authorize (GDBusMethodInvocation *invocation,
                            const char *action, char *err, size_t errlen);

#endif /* MLOOP_DBUS_CALLER_H */
