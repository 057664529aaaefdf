/* mloop — who calls mloop's D-Bus service (caller.h), through
 * libpolkit-gobject: polkit's own client library, which knows how to
 * name a bus caller to polkitd and read its answer.
 *
 * Thread model: everything here runs in the main loop's thread; an
 * authorization in progress is a pending call to polkitd, not a thread.
 * Only the proxy for polkitd is made in a thread of GIO's, once, and
 * mloop_caller_subordinate, which may wait on the user database, runs
 * in a thread of its caller's.
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <polkit/polkit.h>

#include "caller.h"
#include "user_db.h"

/* Whose subordinate uids each uid is, as newuidmap reads it. */
#define MLOOP_SUBUID_FILE "/etc/subuid"

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
  g_autoptr (GVariant) creds = NULL;
  g_autofree char *err = NULL;
  guint32 uid = 0, pid = 0;

  reply = g_dbus_connection_call_finish (G_DBUS_CONNECTION (source), res,
                                         &gerr);
  if (reply == NULL) {
    g_dbus_error_strip_remote_error (gerr);
    err = g_strdup_printf ("cannot tell which user %s is: %s", sender,
                           gerr->message);
  }
  else {
    creds = g_variant_get_child_value (reply, 0);
    if (!g_variant_lookup (creds, "UnixUserID", "u", &uid))
      err = g_strdup_printf ("cannot tell which user %s is: the bus does "
                             "not say", sender);
    g_variant_lookup (creds, "ProcessID", "u", &pid);
  }
  l->done (l->invocation, (uid_t) uid, (pid_t) pid, err, l->data);
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
                          "GetConnectionCredentials",
                          g_variant_new ("(s)", g_dbus_method_invocation_get_sender
                                         (invocation)),
                          G_VARIANT_TYPE ("(a{sv})"), G_DBUS_CALL_FLAGS_NONE,
                          (int) timeout_ms, NULL, uid_answered, l);
}

/* The text of file NAME in directory DIR, at most SIZE - 1 bytes, into
 * BUF; -1 with errno.
 */
static int
read_small (int dir, const char *name, char *buf, size_t size)
{
  int fd = openat (dir, name, O_RDONLY | O_CLOEXEC);
  ssize_t n;
  int saved;

  if (fd == -1)
    return -1;
  n = read (fd, buf, size - 1);
  saved = errno;
  close (fd);
  errno = saved;
  if (n < 0)
    return -1;
  buf[n] = '\0';
  return 0;
}

/* The effective uid in the text of /proc/PID/status, or -1. */
static long long
status_euid (const char *status)
{
  const char *line = strstr (status, "\nUid:");
  unsigned long long real, effective;

  if (line == NULL || sscanf (line, "\nUid:\t%llu\t%llu", &real,
                              &effective) != 2)
    return -1;
  return (long long) effective;
}

/* Whether OWNER, a name or a uid as /etc/subuid gives it, is LOGIN.
 * The user database's entry may be larger than any first guess (a
 * long GECOS field, a directory's attributes): the buffer grows until
 * it fits, to a bound, since an owner not matched would leave each of
 * their subordinate uids a person of its own.
 */
static bool
owner_is (const char *owner, uid_t login)
{
  struct passwd pw;
  g_autofree char *buf = NULL;
  char *end;
  unsigned long long n;

  errno = 0;
  n = strtoull (owner, &end, 10);
  if (errno == 0 && end != owner && *end == '\0')
    return n == (unsigned long long) login;
  return mloop_user_by_name (owner, &pw, &buf) == 0 && pw.pw_uid == login;
}

/* Whether UID is one of LOGIN's subordinate uids (FILE: /etc/subuid,
 * lines "owner:first:count"), those newuidmap lets LOGIN's processes
 * run as.  A file that cannot be read gives LOGIN none.
 */
static bool
subordinate_of (const char *file, uid_t uid, uid_t login)
{
  FILE *f = fopen (file, "re");
  char *line = NULL, *save = NULL;
  size_t size = 0;
  bool found = false;

  if (f == NULL)
    return false;
  while (!found && getline (&line, &size, f) != -1) {
    char *owner = strtok_r (line, ":\n", &save);
    char *first = strtok_r (NULL, ":\n", &save);
    char *count = strtok_r (NULL, ":\n", &save);
    unsigned long long lo, n;

    if (owner == NULL || first == NULL || count == NULL)
      continue;
    lo = strtoull (first, NULL, 10);
    n = strtoull (count, NULL, 10);
    found = uid >= lo && uid - lo < n && owner_is (owner, login);
  }
  free (line);
  fclose (f);
  return found;
}

int
mloop_caller_login (pid_t pid, uid_t uid, uid_t *login, char *err,
                    size_t errlen)
{
  /* status holds a line per group: 2 KB fit the lines before Uid. */
  char status[2048], text[32], path[32], *end;
  unsigned long long l;
  int dir;

  *login = uid;
  /* Root is root, whoever logged in: root's calls are not counted. */
  if (pid <= 0 || uid == 0)
    return 0;
  /* Opened once: the pid, were the process to exit, could be another
   * process's by the time a second file is opened.
   */
  snprintf (path, sizeof path, "/proc/%d", (int) pid);
  dir = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir == -1 || read_small (dir, "status", status, sizeof status) == -1 ||
      read_small (dir, "loginuid", text, sizeof text) == -1) {
    snprintf (err, errlen, "cannot tell who runs process %d: %s", (int) pid,
              strerror (errno));
    if (dir != -1)
      close (dir);
    return -1;
  }
  close (dir);
  if (status_euid (status) != (long long) uid) {
    snprintf (err, errlen, "process %d no longer runs as uid %u, the "
              "user it called as", (int) pid, (unsigned) uid);
    return -1;
  }
  errno = 0;
  l = strtoull (text, &end, 10);
  if (errno || end == text || (*end != '\0' && *end != '\n')) {
    snprintf (err, errlen, "cannot tell who runs process %d: its login "
              "uid reads %.20s", (int) pid, text);
    return -1;
  }
  /* (uid_t) -1: no login uid (a process no login started); 0: root
   * logged in and became UID, whose calls count as UID's, since root's
   * are not counted at all.
   */
  if (l != 0 && l < (uid_t) -1)
    *login = (uid_t) l;
  return 0;
}

bool
mloop_caller_subordinate (uid_t uid, uid_t login)
{
  return subordinate_of (MLOOP_SUBUID_FILE, uid, login);
}

/* One authorization in progress. */
struct check {
  GDBusMethodInvocation *invocation;
  char *action;
  unsigned timeout_s;
  PolkitSubject *subject;
  PolkitCheckAuthorizationFlags flags;
  GCancellable *cancel;
  guint timer;
  bool timed_out;
  bool waiting;                 /* in checks_waiting, not asked yet */
  mloop_authorized_fn done;
  gpointer data;
};

/* polkit's authority, a proxy for polkitd: made once, on the side
 * (polkit_authority_get_async, whose round trips to the bus and to
 * polkitd run in a thread of GIO's), since those answers can be lost
 * as the uid lookup's can (caller.h) and a wait for them here would
 * hold up every call.  Checks that come meanwhile wait for it in
 * CHECKS_WAITING, their time limit running.
 */
static PolkitAuthority *authority;
static bool authority_asked;
static GQueue checks_waiting = G_QUEUE_INIT;

static void
check_finish (struct check *c, const char *err)
{
  if (c->timer)
    g_source_remove (c->timer);
  c->done (c->invocation, err, c->data);
  g_object_unref (c->invocation);
  g_object_unref (c->subject);
  g_object_unref (c->cancel);
  g_free (c->action);
  g_free (c);
}

/* The refusal of C after its time limit. */
static char *
timed_out_refusal (const struct check *c)
{
  return g_strdup_printf ("not authorized: polkit did not answer for %s "
                          "within %u s (an authentication left waiting?)",
                          c->action, c->timeout_s);
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
  if (c->waiting) {
    g_autofree char *err = timed_out_refusal (c);

    g_queue_remove (&checks_waiting, c);
    check_finish (c, err);
  }
  else
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
    err = timed_out_refusal (c);
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

static void
ask (struct check *c)
{
  polkit_authority_check_authorization (authority, c->subject, c->action,
                                        NULL, c->flags, c->cancel,
                                        check_answered, c);
}

/* The authority made, or not: every check waiting for it is asked, or
 * refused (the next check asks for the authority again).
 */
static void
authority_made (GObject *source, GAsyncResult *res, gpointer unused)
{
  g_autoptr (GError) gerr = NULL;
  struct check *c;

  authority = polkit_authority_get_finish (res, &gerr);
  authority_asked = false;
  while ((c = g_queue_pop_head (&checks_waiting)) != NULL) {
    c->waiting = false;
    if (authority)
      ask (c);
    else {
      g_autofree char *err =
        g_strdup_printf ("cannot ask polkit whether you may (%s): %s",
                         c->action, gerr->message);

      check_finish (c, err);
    }
  }
}

void
mloop_caller_authorize (GDBusMethodInvocation *invocation,
                        const char *action, unsigned timeout_s,
                        mloop_authorized_fn done, gpointer data)
{
  const char *sender = g_dbus_method_invocation_get_sender (invocation);
  GDBusMessage *msg = g_dbus_method_invocation_get_message (invocation);
  struct check *c = g_new0 (struct check, 1);

  c->invocation = g_object_ref (invocation);
  c->action = g_strdup (action);
  c->timeout_s = timeout_s;
  c->subject = polkit_system_bus_name_new (sender);
  c->flags = POLKIT_CHECK_AUTHORIZATION_FLAGS_NONE;
  if (g_dbus_message_get_flags (msg) &
      G_DBUS_MESSAGE_FLAGS_ALLOW_INTERACTIVE_AUTHORIZATION)
    c->flags = POLKIT_CHECK_AUTHORIZATION_FLAGS_ALLOW_USER_INTERACTION;
  c->cancel = g_cancellable_new ();
  c->done = done;
  c->data = data;
  /* The wait for the authority counts in the time limit. */
  c->timer = g_timeout_add_seconds (timeout_s, check_timed_out, c);
  if (authority) {
    ask (c);
    return;
  }
  c->waiting = true;
  g_queue_push_tail (&checks_waiting, c);
  if (!authority_asked) {
    authority_asked = true;
    polkit_authority_get_async (NULL, authority_made, NULL);
  }
}
