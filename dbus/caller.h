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

/* polkit's answer: ERR is NULL when the caller may, else one line saying
 * why not (polkit said no, could not be asked, or did not answer in
 * time).  Called in the main loop's thread.
 */
typedef void (*mloop_authorized_fn) (GDBusMethodInvocation *invocation,
                                     const char *err, gpointer data);

/* Asks polkit whether INVOCATION's caller may do ACTION, without
 * waiting: DONE is called with the answer once polkit gives it, or
 * after TIMEOUT_S seconds without one (the check is then cancelled,
 * which closes the caller's authentication dialog).  Asks the user to
 * authenticate (through their polkit agent) only when the caller allowed
 * interactive authorization; other calls are served meanwhile.
 */
void mloop_caller_authorize (GDBusMethodInvocation *invocation,
                             const char *action, unsigned timeout_s,
                             mloop_authorized_fn done, gpointer data);

#endif /* MLOOP_DBUS_CALLER_H */
