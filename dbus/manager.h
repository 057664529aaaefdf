/* mloop — the object mloop's D-Bus service exports: org.mloop.Manager1
 * at /org/mloop/Manager1 (org.mloop.Manager1.xml describes it).
 *
 *   Attach (h image, s name, a{sv} options) -> (s device)
 *       IMAGE: the image, opened by the caller (O_RDWR, or O_RDONLY with
 *       option "read-only"); NAME: its absolute path, recorded and shown,
 *       never opened.  Options: "read-only", "no-partscan", "autoclear"
 *       (booleans, each at most once).  The message carries IMAGE's
 *       descriptor and no other.  polkit action org.mloop.attach;
 *       refused to a user (not root) who already has the most devices
 *       they may.
 *   Detach (s device)
 *       DEVICE (/dev/nbdN, or the image's absolute path, shorter than
 *       PATH_MAX;
 *       the message carries no descriptor): polkit action
 *       org.mloop.detach before DEVICE is looked at or looked for, then
 *       org.mloop.detach-other if another user attached it.
 *   List (b json) -> (s text)
 *       What `mloop list [--json]` prints as root (the message carries
 *       no descriptor).
 *
 * A user's Attach or Detach past MLOOP_MAX_CALLS_PER_USER of their calls
 * in progress is refused at once (org.mloop.Error.LimitsExceeded).
 * A "user" of each limit is a person, counted by login uid with all
 * their subordinate uids (caller.h, mloop_caller_login).
 *
 * Calls are served in parallel: each waits for polkit without holding up
 * the others (an authentication dialog may stay open a long time), then
 * its attach or detach runs in the device thread, one at a time.
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

/* What one user may hold of the machine, and how long a call waits for
 * polkit (mloop-dbus's options; docs/mloop-dbus.8.pod).
 */
#define MLOOP_DEFAULT_MAX_DEVICES_PER_USER 4
#define MLOOP_DEFAULT_AUTHORIZATION_TIMEOUT_S 120

/* Calls one user (not root) may have in progress at once, from their
 * arrival until their answer: a call waiting for polkit (an
 * authentication dialog left open waits --authorization-timeout) holds
 * the service's memory and the descriptor it passed, and without a bound
 * one user's waiting calls could take every descriptor the service has.
 * Enough for a person's attaches and detaches at once.
 */
#define MLOOP_MAX_CALLS_PER_USER 8

/* Calls, all users' together, waiting for the bus to say which user
 * makes them: until it does, a call is counted against nobody, and
 * holds its message and descriptor.  The bus answers at once, but drops
 * its answers while a burst of calls fills its queue to the service,
 * and such a call waits out the lookup's timeout (5 s).  Past this many
 * the next call is refused at once (org.mloop.Error.LimitsExceeded).
 */
#define MLOOP_MAX_UID_LOOKUPS 64

/* Calls, all users' together, waiting for the user database to say
 * whether their uid is a subordinate uid of their login uid's
 * (caller.h), one after the other in one thread of their own: a
 * source that does not answer (LDAP, say) holds those calls, not the
 * service's main loop.
 * Past this many the next such call is refused at once
 * (org.mloop.Error.LimitsExceeded); others are served as before.
 */
#define MLOOP_MAX_OWNER_LOOKUPS 64

/* Lists, all users' together, waiting to be answered, one after the
 * other in one thread of their own: a list names each device's owner,
 * which waits on the user database (LDAP, say, may not answer).  Each
 * holds its message.  Past this many the next is refused at once
 * (org.mloop.Error.LimitsExceeded); attaches and detaches are served
 * as before.
 */
#define MLOOP_MAX_LISTS_WAITING 64

struct mloop_manager_limits {
  /* Devices attached through the service one user (not root) may have
   * at once: each costs a server, AIO events and an nbd index that the
   * machine has a fixed number of.
   */
  unsigned max_devices_per_user;
  /* How long polkit may take to answer, seconds: an authentication
   * dialog left open is dismissed after it.
   */
  unsigned authorization_timeout_s;
};

/* Exports the object on CONNECTION, with LIMITS (kept); false after
 * logging why not.
 */
bool mloop_manager_export (GDBusConnection *connection,
                           const struct mloop_manager_limits *limits);

/* Reaps the supervisors that exited (each attach forks one, which exits
 * at its device's detach), unless an attach or detach is in progress:
 * that one waits for its own children.
 */
void mloop_manager_reap (void);

#endif /* MLOOP_DBUS_MANAGER_H */
