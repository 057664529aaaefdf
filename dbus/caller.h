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

/* The user INVOCATION's caller runs as and its process (0 when the bus
 * does not say), or ERR (one line) saying why the user is not known.
 * Called in the main loop's thread.
 */
typedef void (*mloop_caller_uid_fn) (GDBusMethodInvocation *invocation,
                                     uid_t uid, pid_t pid, const char *err,
                                     gpointer data);

/* Asks the bus which user INVOCATION's caller runs as, and which
 * process it is (the mounts it sees: attach.h), without waiting:
 * DONE is called with the answer, or after TIMEOUT_MS without one.  The
 * bus answers at once, but drops what it would deliver to this service
 * while its queue to the service is full (a burst of calls fills it):
 * a wait in the main loop would then hold up every call for the
 * lookup's whole timeout.
 */
void mloop_caller_uid (GDBusMethodInvocation *invocation, unsigned timeout_ms,
                       mloop_caller_uid_fn done, gpointer data);

/* The person behind a caller the bus says runs as UID in process PID
 * (0: not said) is what each per-user limit counts by (manager.h).  A
 * user with subordinate uids (/etc/subuid) runs callers as any of them
 * in a user namespace, each its own uid on the bus, and polkit lets
 * them all do what the user may (it judges by the session, not the
 * uid); but all of them keep the login uid the user's session gave
 * (/proc/PID/loginuid), which no process without CAP_AUDIT_CONTROL can
 * change once set.  So the person is the login uid when one is set,
 * not root's, and UID is it or one of its subordinate uids
 * (/etc/subuid); else UID.  A process with none may set any once,
 * unprivileged: it names only the person who may run as UID.
 *
 * In two steps.  mloop_caller_login reads the process's /proc only,
 * never waiting on anyone: *LOGIN is the person when it is UID (root,
 * no pid, no login uid or root's, or UID's own); else the login uid,
 * the person only if mloop_caller_subordinate (UID, *LOGIN) says so,
 * and UID otherwise.  The process must still run as UID (its effective
 * uid): a pid reused by another user's process would charge that user.
 * Returns 0 with *LOGIN, or -1 with ERR (one line).
 */
int mloop_caller_login (pid_t pid, uid_t uid, uid_t *login, char *err,
                        size_t errlen);

/* Whether UID is one of LOGIN's subordinate uids in /etc/subuid.  Its
 * owners may be named, and each name of a range holding UID is looked
 * up in the user database, whose sources (LDAP, sssd) may take as long
 * as they like: never called in the main loop's thread, where it would
 * hold up every call.
 */
bool mloop_caller_subordinate (uid_t uid, uid_t login);

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
