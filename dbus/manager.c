/* mloop — org.mloop.Manager1, the object of mloop's D-Bus service
 * (manager.h).
 *
 * Thread model: calls arrive in the main loop's thread, which asks
 * polkit for each without waiting (caller.h), so a caller whose
 * authentication dialog stays open holds up nobody else.  A caller
 * whose login uid is not its uid is matched with /etc/subuid in the
 * owner lookup thread, since the user database may never answer.  A
 * detach's
 * path is then resolved as its caller in a thread of the call's own,
 * since a path on the caller's FUSE mount may never resolve: that holds
 * up only the caller, whose calls in progress are bounded.  What a call
 * then does to devices runs in one device thread, one call at a time:
 * an attach or detach takes a second or two; one at a time keeps the
 * per-user count exact and lets the reaper (main.c) tell an exited
 * supervisor from a child an attach is waiting for.  List reads the
 * run directory and names the devices' owners, which waits on the user
 * database, in a list thread of its own, at once unless that waits.
 * D-Bus replies may be sent from any of these threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/openat2.h>

#include <gio/gio.h>

#include "attach.h"
#include "caller.h"
#include "describe.h"
#include "descriptors.h"
#include "held_image.h"
#include "manager.h"
#include "nbd_netlink.h"
#include "nbd_sysfs.h"
#include "printable.h"
#include "refusal_log.h"
#include "store_name.h"
#include "user_db.h"

#define ERROR_FAILED "org.mloop.Error.Failed"
#define ERROR_NOT_AUTHORIZED "org.mloop.Error.NotAuthorized"
#define ERROR_INVALID "org.mloop.Error.InvalidArgs"
#define ERROR_LIMIT "org.mloop.Error.LimitsExceeded"

static struct mloop_manager_limits limits;
/* The device thread: one call's attach or detach at a time. */
static GThreadPool *device_thread;
/* Held by the device thread while it works; the reaper only tries it. */
static GMutex device_work;

/* Each person's calls in progress (person -> count: caller.h), from
 * every thread.
 */
static GMutex calls_lock;
static GHashTable *calls_of;

enum call_kind { CALL_ATTACH, CALL_DETACH, CALL_DETACH_OTHER };

/* How long the bus may take to say which user a caller is. */
#define UID_LOOKUP_TIMEOUT_MS 5000

/* What a detach asks for, as the device library may look for it. */
struct detach_target {
  char *name;           /* a device's name, a URI or RBD name, or a path */
  bool resolved;        /* NAME is canonical, resolved as the caller */
  struct stat st;       /* when RESOLVED: the identity of NAME's file */
};

/* A call on its way from polkit's answer to the device thread. */
struct call {
  enum call_kind kind;
  const char *action;           /* the polkit action asked first */
  GDBusMethodInvocation *invocation;
  uid_t uid;
  /* Whom UID's call counts against: its login uid, shared by every
   * subordinate uid of theirs (caller.h).  0 only for root.
   */
  uid_t person;
  pid_t pid;                    /* the caller's process, 0: unknown */
  /* Attach: the image's name; detach: the device or image asked for,
   * then (CALL_DETACH_OTHER) the device found, its owner and
   * directory (each attach makes one of its own: mkdtemp), which must
   * be the same when polkit has said yes.
   */
  char *what;
  uid_t owner;
  char *device_dir;
  GVariant *options;            /* attach */
  struct detach_target *target; /* CALL_DETACH: WHAT resolved as UID */
  gint32 handle;                /* attach: the image's descriptor */
  bool counted;                 /* among its user's calls in progress */
};

/* Counts one more call of PERSON's in progress: false, counting
 * nothing, when PERSON (not root) has as many as they may.
 */
static bool
calls_take (uid_t person)
{
  gpointer key = GUINT_TO_POINTER ((guint) person);
  guint n;
  bool ok;

  if (person == 0)
    return true;
  g_mutex_lock (&calls_lock);
  if (calls_of == NULL)
    calls_of = g_hash_table_new (NULL, NULL);
  n = GPOINTER_TO_UINT (g_hash_table_lookup (calls_of, key));
  ok = n < MLOOP_MAX_CALLS_PER_USER;
  if (ok)
    g_hash_table_insert (calls_of, key, GUINT_TO_POINTER (n + 1));
  g_mutex_unlock (&calls_lock);
  return ok;
}

static void
calls_release (uid_t person)
{
  gpointer key = GUINT_TO_POINTER ((guint) person);
  guint n;

  if (person == 0)
    return;
  g_mutex_lock (&calls_lock);
  n = GPOINTER_TO_UINT (g_hash_table_lookup (calls_of, key));
  if (n > 1)
    g_hash_table_insert (calls_of, key, GUINT_TO_POINTER (n - 1));
  else
    g_hash_table_remove (calls_of, key);
  g_mutex_unlock (&calls_lock);
}

static void
call_free (struct call *c)
{
  if (c->counted)
    calls_release (c->person);
  g_object_unref (c->invocation);
  g_free (c->what);
  g_free (c->device_dir);
  if (c->options)
    g_variant_unref (c->options);
  if (c->target)
    g_free (c->target->name);
  g_free (c->target);
  g_free (c);
}

/* Answers INVOCATION with the error NAME and message ERR.  ERR may
 * quote the caller's name cut short to fit its buffer, which can split
 * a character: D-Bus carries only UTF-8, so a split one is replaced
 * (GDBus would otherwise send "[Invalid UTF-8]" and log a critical).
 */
static void
reply_error (GDBusMethodInvocation *invocation, const char *name,
             const char *err)
{
  g_autofree char *valid = g_utf8_make_valid (err, -1);

  g_dbus_method_invocation_return_dbus_error (invocation, name, valid);
}

/* Ends C with an error NAME and message ERR. */
static void
call_fail (struct call *c, const char *name, const char *err)
{
  reply_error (c->invocation, name, err);
  call_free (c);
}

/* The descriptor at HANDLE in INVOCATION's message, a duplicate owned by
 * the caller of this, closed with mloop_descriptors_close; -1 with ERR.
 */
static int
passed_fd (GDBusMethodInvocation *invocation, gint32 handle, char *err,
           size_t errlen)
{
  GDBusMessage *msg = g_dbus_method_invocation_get_message (invocation);
  int fd;

  /* The caller's number, checked: GLib checks no lower bound. */
  if (handle < 0 || handle >= mloop_descriptors_count (msg)) {
    snprintf (err, errlen, "descriptor %d was not passed with the call",
              handle);
    return -1;
  }
  fd = mloop_descriptors_dup (msg, handle);
  if (fd == -1)
    snprintf (err, errlen, "descriptor %d: %s", handle, strerror (errno));
  return fd;
}

static gboolean
option (GVariant *options, const char *name)
{
  gboolean value = FALSE;

  g_variant_lookup (options, name, "b", &value);
  return value;
}

/* The options Attach knows, each at most once: false with ERR naming
 * one it does not know or one given again.  Once: a call waiting for
 * polkit keeps its message, and a known option repeated could make it
 * as big as the bus lets a message be.
 */
static bool
options_known (GVariant *options, char *err, size_t errlen)
{
  static const char *const known[] = {
    "read-only", "no-partscan", "autoclear", NULL,
  };
  unsigned seen = 0;
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
    for (unsigned i = 0; known[i]; i++)
      if (strcmp (known[i], key) == 0) {
        if (seen & (1u << i)) {
          snprintf (err, errlen, "option %s given twice", key);
          return false;
        }
        seen |= 1u << i;
      }
  }
  return true;
}

/* Whether INVOCATION's message carries WANT descriptors, and *HANDLE
 * (unless HANDLE is NULL) names one of them; false with ERR if not.  A call waiting for polkit keeps them all open: one
 * carrying as many as the bus lets a message carry, beyond the one an
 * Attach needs, would take that many of the service's descriptors.
 */
static bool
descriptors_passed (GDBusMethodInvocation *invocation, int want,
                    const gint32 *handle, char *err, size_t errlen)
{
  int n = mloop_descriptors_count
    (g_dbus_method_invocation_get_message (invocation));

  if (n == want && handle && (*handle < 0 || *handle >= n)) {
    snprintf (err, errlen, "descriptor %d was not passed with the call "
              "(%d was)", *handle, n);
    return false;
  }
  if (n == want)
    return true;
  if (want == 0)
    snprintf (err, errlen, "%d descriptors were passed with a call that "
              "takes none", n);
  else
    snprintf (err, errlen, "%d descriptors were passed: pass the image's, "
              "and only it", n);
  return false;
}

/* Users' devices detached while a descriptor a user opened on the node
 * stayed open.  The kernel keeps such a device (it is busy, and counts
 * as connected) until the last descriptor closes, and the next attach
 * gets another: uncounted, a user could pin any number of devices by
 * opening each node before detaching it.  They count against their
 * owner's cap until the kernel lets them go.  Only the device thread
 * touches this; a service restarted meanwhile forgets them.
 */
struct held_device {
  int index;
  uid_t person;                 /* whom it counts against */
  /* The backend the device still shows, its state's; NULL for an idle
   * device held open (an autoclear device the kernel let go, which its
   * user opened again before its supervisor looked: configured, not
   * started, no backend).
   */
  char *backend;
};

static GArray *held_after_detach;

static void
held_device_clear (gpointer p)
{
  g_free (((struct held_device *) p)->backend);
}

/* Whether nbd device INDEX is configured but not started and shows no
 * backend: an idle device a descriptor holds open.
 */
static bool
idle_held_open (int index, const char *shown)
{
  bool connected = false;
  char why[256];

  return (shown == NULL || *shown == '\0') &&
    !mloop_nbd_sysfs_started (index) &&
    mloop_nbd_netlink_connected (index, &connected, why, sizeof why) == 0 &&
    connected;
}

/* Whether H is still held as it was when noted. */
static bool
still_held (const struct held_device *h)
{
  g_autofree char *shown = mloop_nbd_sysfs_backend ("/sys/block", h->index);

  if (h->backend)
    return shown && strcmp (shown, h->backend) == 0;
  return idle_held_open (h->index, shown);
}

/* After a detach of device S: remembered if still held.  S's own
 * device, which shows S's backend until its last descriptor closes; or
 * S's idle device held open, which only its user (whose node it was)
 * or root can have opened.  Not another's device connected at a stale
 * state's index since.
 */
static void
note_if_held (const struct mloop_device_state *s)
{
  struct held_device h = { .index = s->index, .person = s->person };
  g_autofree char *shown = NULL;

  if (s->owner == 0)
    return;
  shown = mloop_nbd_sysfs_backend ("/sys/block", s->index);
  if (shown && strcmp (shown, mloop_state_backend (s)) == 0)
    h.backend = g_steal_pointer (&shown);
  else if (!idle_held_open (s->index, shown))
    return;
  if (held_after_detach == NULL) {
    held_after_detach = g_array_new (FALSE, FALSE, sizeof h);
    g_array_set_clear_func (held_after_detach, held_device_clear);
  }
  g_array_append_val (held_after_detach, h);
}

/* How many of PERSON's detached devices are still held, forgetting
 * those the kernel let go, or that hold another device since (another
 * backend shown, or one started).
 */
static unsigned
held_of (uid_t person)
{
  unsigned held = 0;

  for (guint i = 0; held_after_detach && i < held_after_detach->len; ) {
    const struct held_device *h =
      &g_array_index (held_after_detach, struct held_device, i);

    if (!still_held (h)) {
      g_array_remove_index_fast (held_after_detach, i);
      continue;
    }
    held += h->person == person;
    i++;
  }
  return held;
}

/* How many devices PERSON has attached, as any uid of theirs (through
 * the service: root's own attaches are root's), and in *HELD how many
 * more they detached but still hold open.
 */
static unsigned
devices_of (uid_t person, unsigned *held)
{
  size_t n;
  struct mloop_device_state *devices = mloop_state_list (&n);
  unsigned mine = 0;

  for (size_t i = 0; i < n; i++)
    mine += devices[i].owner != 0 && devices[i].person == person;
  *held = held_of (person);
  mloop_state_free_list (devices, n);
  return mine;
}

/* The most of a caller's image name, and of a refusal, one log line
 * shows: a name may be 4,095 control characters, each shown as four,
 * and an attach that works, detached again, is logged every second or
 * two, as often as a user likes.
 */
#define LOGGED_NAME_MAX 256
#define LOGGED_REFUSAL_MAX 512

/* In the device thread: C's attach, if its user may have one more. */
static void
attach_now (struct call *c)
{
  struct mloop_device_state st;
  g_autofree char *device = NULL;
  g_autofree char *shown = mloop_printable_short (c->what, LOGGED_NAME_MAX);
  g_autofree char *why = NULL;
  unsigned mine, held = 0;
  char err[1024];
  int fd, r;

  if (c->uid != 0 &&
      (mine = devices_of (c->person, &held)) + held >=
      limits.max_devices_per_user) {
    if (held == 0)
      snprintf (err, sizeof err, "a user may have %u devices attached at "
                "once (mloop-dbus --max-devices-per-user) and you have %u: "
                "detach one first", limits.max_devices_per_user, mine);
    else
      snprintf (err, sizeof err, "a user may have %u devices attached at "
                "once (mloop-dbus --max-devices-per-user) and you have %u, "
                "%u of them detached but still open: close them or detach "
                "one first", limits.max_devices_per_user, mine + held, held);
    mloop_refusal_log (c->person, "uid %u: attach %s refused: %s",
                       (unsigned) c->uid, shown, err);
    call_fail (c, ERROR_LIMIT, err);
    return;
  }
  fd = passed_fd (c->invocation, c->handle, err, sizeof err);
  if (fd == -1) {
    call_fail (c, ERROR_FAILED, err);
    return;
  }

  const struct mloop_attach_request req = {
    .file = c->what, .has_image_fd = true, .image_fd = fd,
    .owner = c->uid, .person = c->person, .caller_pid = c->pid, .index = -1,
    .transport = MLOOP_CHOOSE_NBD,
    .read_only = option (c->options, "read-only"),
    .no_partscan = option (c->options, "no-partscan"),
    .autoclear = option (c->options, "autoclear"),
  };
  r = mloop_attach (&req, &st, err, sizeof err);
  mloop_descriptors_close (fd);
  if (r == -1) {
    why = mloop_printable_short (err, LOGGED_REFUSAL_MAX);
    mloop_refusal_log (c->person, "uid %u: attach %s refused: %s",
                       (unsigned) c->uid, shown, why);
    call_fail (c, ERROR_FAILED, err);
    return;
  }
  device = mloop_state_device_path (&st);
  g_message ("uid %u: attached %s as %s", (unsigned) c->uid, shown, device);
  mloop_state_clear (&st);
  g_dbus_method_invocation_return_value (c->invocation,
                                         g_variant_new ("(s)", device));
  call_free (c);
}

/* Every group the user database gives PW's user, its primary group
 * among them, into *LIST (to free); their count, or -1 with errno.
 * All of them, however many: a file may deny a group (group bits below
 * other's, an ACL entry of a group with no right), so one left out
 * can be more rights, not fewer.  The kernel takes at most NGROUPS_MAX.
 */
static int
groups_of (const struct passwd *pw, gid_t **list)
{
  int room = 64, count;

  for (;;) {
    *list = g_renew (gid_t, *list, room);
    count = room;
    if (getgrouplist (pw->pw_name, pw->pw_gid, *list, &count) != -1)
      return count;
    /* glibc says how many there are; grow at least twofold anyway. */
    room = MAX (count, room * 2);
    if (room > NGROUPS_MAX) {
      errno = EINVAL;
      return -1;
    }
  }
}

/* Sets this thread's file system credentials to UID's (its primary
 * group and every group the user database gives it), or back to root's
 * (GROUPS, N: root's own) when UID is 0.  Only this thread's: the
 * kernel keeps them per thread, and setgroups is called directly
 * because glibc's would change every thread's.
 */
static int
act_as (uid_t uid, const gid_t *groups, int n)
{
  struct passwd pw;
  g_autofree char *buf = NULL;
  g_autofree gid_t *list = NULL;
  int count;

  if (uid == 0) {
    setfsgid (0);
    setfsuid (0);
    return (int) syscall (SYS_setgroups, (size_t) n, groups);
  }
  /* A uid with no entry has no group to act as: never root's. */
  if (mloop_user_by_uid (uid, &pw, &buf) == -1 ||
      (count = groups_of (&pw, &list)) == -1 ||
      syscall (SYS_setgroups, (size_t) count, list) == -1)
    return -1;
  setfsgid (pw.pw_gid);
  setfsuid (uid);
  return (uid_t) setfsuid ((uid_t) -1) == uid ? 0 : -1;
}


/* WHAT, the device or image a detach asks for, into *T: a device's
 * name as it is; a path resolved by UID, with UID's rights, to a
 * canonical path and its file's identity, so that the lookup, run as
 * root, resolves no name again: it tells the caller nothing about what
 * exists where they cannot look, even if they swap a directory of
 * theirs for a symlink meanwhile, and triggers no automount they could
 * not.  The path is opened once (O_PATH), and the name and identity are
 * the open file's.  Without the magic links of /proc (fd/N, cwd, root,
 * exe), which resolve in this process and would lead the caller to what
 * the service holds open, where they cannot look.  False with ERR.
 */
/* The canonical path of the file PATH names and its identity (*ST), as
 * this thread's file system credentials find it, following no magic
 * link; NULL with errno.
 */
static char *
open_as_caller (const char *path, struct stat *st)
{
  struct open_how how = {
    .flags = O_PATH | O_CLOEXEC,
    .resolve = RESOLVE_NO_MAGICLINKS,
  };
  g_autofree char *self = NULL;
  char *name;
  int fd, saved;

  fd = (int) syscall (SYS_openat2, AT_FDCWD, path, &how, sizeof how);
  if (fd == -1)
    return NULL;
  self = g_strdup_printf ("/proc/self/fd/%d", fd);
  name = fstat (fd, st) == 0 ? g_file_read_link (self, NULL) : NULL;
  saved = errno;
  close (fd);
  errno = saved;
  if (name && name[0] != '/') {
    g_free (name);
    errno = ENOENT;
    return NULL;
  }
  return name;
}

static bool
resolve_as (const char *what, uid_t uid, struct detach_target *t, char *err,
            size_t errlen)
{
  bool ublk;
  gid_t root_groups[64];
  int n_root, saved;

  *t = (struct detach_target) { 0 };
  if (mloop_device_index (what, &ublk) >= 0 || strstr (what, "://") ||
      mloop_is_rbd_name (what) || uid == 0) {
    t->name = g_strdup (what);
    return true;
  }
  n_root = getgroups (G_N_ELEMENTS (root_groups), root_groups);
  if (n_root == -1 || act_as (uid, NULL, 0) == -1) {
    snprintf (err, errlen, "%s: cannot look for it as uid %u: %s", what,
              (unsigned) uid, strerror (errno));
    if (n_root != -1)
      act_as (0, root_groups, n_root);
    return false;
  }
  t->name = open_as_caller (what, &t->st);
  saved = errno;
  if (act_as (0, root_groups, n_root) == -1)
    g_error ("cannot take back root's credentials: %s", strerror (errno));
  if (t->name == NULL && saved == ENOSYS) {
    snprintf (err, errlen, "%s: cannot look for it safely: openat2 is "
              "refused here (a kernel before 5.6, or a seccomp filter)", what);
    return false;
  }
  if (t->name == NULL) {
    snprintf (err, errlen, "%s: not an nbd or ublk device, and %s", what,
              strerror (saved));
    return false;
  }
  t->resolved = true;
  return true;
}

static gboolean ask_detach_other (gpointer data);

/* Runs FN (DATA) in the main thread, from a worker thread.  Never
 * g_main_context_invoke: when the main loop is not running (it has
 * quit, on SIGTERM, while a worker finishes), that runs FN at once in
 * the worker, on state only the main thread touches.  Sources of one
 * priority run in the order they were attached.
 */
static void
in_main_thread (GSourceFunc fn, gpointer data)
{
  g_idle_add_full (G_PRIORITY_DEFAULT, fn, data, NULL);
}

/* In the device thread: the device C's detach names, into *ST; false,
 * C ended, when there is none.
 */
static bool
find_target (struct call *c, struct mloop_device_state *st)
{
  struct detach_target what;
  char err[1024];
  int found;

  /* A detach's path was resolved in its own thread (resolve_thread). */
  if (c->target) {
    what = *c->target;
    g_clear_pointer (&c->target, g_free);
  }
  else if (!resolve_as (c->what, c->uid, &what, err, sizeof err)) {
    call_fail (c, ERROR_INVALID, err);
    return false;
  }
  /* The caller's own device first, whatever the name: a device's
   * name (/dev/nbdN) may be their stale state's and another's device's
   * at once (mloop_lookup_for).
   */
  found = what.resolved
    ? mloop_lookup_resolved (what.name, &what.st, c->uid, st, err,
                             sizeof err)
    : mloop_lookup_for (what.name, c->uid, st, err, sizeof err);
  g_free (what.name);
  if (found == -1) {
    call_fail (c, ERROR_INVALID, err);
    return false;
  }
  return true;
}

/* In the device thread: C's detach, once polkit has let its user detach
 * a device (their own, or with CALL_DETACH_OTHER the one found before).
 */
static void
detach_now (struct call *c)
{
  struct mloop_device_state st;
  g_autofree char *device = NULL;
  char err[1024];

  /* The second round, once polkit let the caller detach another's
   * device: the very state the first round found and asked about.
   * Looked up again by the device's name, the caller's own stale state
   * at that index would come first (mloop_lookup_for), and the answer
   * be "ask again" for ever.
   */
  if (c->kind == CALL_DETACH_OTHER) {
    if (mloop_state_load (c->device_dir, &st) == -1) {
      snprintf (err, sizeof err, "%s is not attached by mloop", c->what);
      call_fail (c, ERROR_INVALID, err);
      return;
    }
  }
  else if (!find_target (c, &st))
    return;
  device = mloop_state_device_path (&st);
  if (c->kind == CALL_DETACH && st.owner != c->uid) {
    /* Another user's device: the stronger action, asked in the main
     * thread, then this very state detached if it is still that
     * owner's.
     */
    g_free (c->what);
    c->what = g_steal_pointer (&device);
    c->owner = st.owner;
    c->device_dir = g_strdup (st.dir);
    mloop_state_clear (&st);
    in_main_thread (ask_detach_other, c);
    return;
  }
  if (c->kind == CALL_DETACH_OTHER && st.owner != c->owner)
    call_fail (c, ERROR_FAILED, "the device changed owner while polkit "
               "was asked: ask again");
  else if (mloop_detach (&st, err, sizeof err) == -1)
    call_fail (c, ERROR_FAILED, err);
  else {
    if (st.transport == MLOOP_TRANSPORT_NBD)
      note_if_held (&st);
    g_message ("uid %u: detached %s", (unsigned) c->uid, device);
    g_dbus_method_invocation_return_value (c->invocation, NULL);
    call_free (c);
  }
  mloop_state_clear (&st);
}

static void
device_thread_run (gpointer data, gpointer unused)
{
  struct call *c = data;

  g_mutex_lock (&device_work);
  if (c->kind == CALL_ATTACH)
    attach_now (c);
  else
    detach_now (c);
  g_mutex_unlock (&device_work);
}

/* In a thread of C's own: the path C's detach names, resolved as its
 * caller, then on to the device thread.
 */
static gpointer
resolve_thread (gpointer data)
{
  struct call *c = data;
  char err[1024];

  c->target = g_new0 (struct detach_target, 1);
  if (!resolve_as (c->what, c->uid, c->target, err, sizeof err))
    call_fail (c, ERROR_INVALID, err);
  else
    g_thread_pool_push (device_thread, c, NULL);
  return NULL;
}

/* polkit's answer for C: on to the device thread, or the refusal. */
static void
authorized (GDBusMethodInvocation *invocation, const char *err,
            gpointer data)
{
  struct call *c = data;
  char why[1024];

  if (err == NULL && c->kind == CALL_DETACH) {
    g_autoptr (GError) gerr = NULL;
    GThread *t = g_thread_try_new ("mloop-resolve", resolve_thread, c, &gerr);

    if (t == NULL) {
      snprintf (why, sizeof why, "cannot start a thread: %s", gerr->message);
      call_fail (c, ERROR_FAILED, why);
    }
    else
      g_thread_unref (t);
    return;
  }
  if (err == NULL) {
    g_thread_pool_push (device_thread, c, NULL);
    return;
  }
  if (c->kind == CALL_DETACH_OTHER) {
    /* "Not your device" is what a user without the action hears. */
    snprintf (why, sizeof why, "%s is not your device (attached by uid "
              "%u), and polkit refused %s", c->what, (unsigned) c->owner,
              MLOOP_ACTION_DETACH_OTHER);
    err = why;
  }
  call_fail (c, ERROR_NOT_AUTHORIZED, err);
}

static gboolean
ask_detach_other (gpointer data)
{
  struct call *c = data;

  c->kind = CALL_DETACH_OTHER;
  mloop_caller_authorize (c->invocation, MLOOP_ACTION_DETACH_OTHER,
                          limits.authorization_timeout_s, authorized, c);
  return G_SOURCE_REMOVE;
}

/* Calls whose caller's user the bus has not told yet (main thread
 * only).  Each holds its message, descriptors and all, and is counted
 * against no user yet: past MLOOP_MAX_UID_LOOKUPS the next is refused
 * at once.  The bus answers at once, but drops its answers while its
 * queue to the service is full, and those wait out the timeout.
 */
static unsigned uid_lookups;

/* Calls whose person is looked for in the user database (main thread
 * only): each holds its message and descriptor, and is counted against
 * nobody yet.  Past MLOOP_MAX_OWNER_LOOKUPS the next such call is
 * refused at once.
 */
static unsigned owner_lookups;

/* The one thread that looks them up, one after the other: their calls
 * come back to the main loop in the order they came, and are counted
 * so (a caller's last call past their cap is the one refused), which
 * a thread per call would not keep.  A lookup that never ends holds up
 * only calls that need one.
 */
static GThreadPool *owner_thread;

/* C's person known: counted, then polkit's answer for C's ACTION. */
static void
person_known (struct call *c)
{
  char why[256];

  /* Before polkit is asked: refused calls must cost nothing. */
  if (!calls_take (c->person)) {
    snprintf (why, sizeof why, "you have %u calls in progress, the most "
              "one user may: wait for one to end", MLOOP_MAX_CALLS_PER_USER);
    call_fail (c, ERROR_LIMIT, why);
    return;
  }
  c->counted = true;
  mloop_caller_authorize (c->invocation, c->action,
                          limits.authorization_timeout_s, authorized, c);
}

/* Back in the main thread: C's person, looked for. */
static gboolean
owner_looked_up (gpointer data)
{
  owner_lookups--;
  person_known (data);
  return G_SOURCE_REMOVE;
}

/* In the owner thread: whether C's login uid, in C->person, is its
 * person, which may wait on the user database as long as its sources
 * take (caller.h): a wait in the main thread would hold up every call.
 * Sources of one priority run in the order they were attached, so the
 * main loop takes the answers in this thread's order.
 */
static void
owner_thread_run (gpointer data, gpointer unused)
{
  struct call *c = data;

  if (!mloop_caller_subordinate (c->uid, c->person))
    c->person = c->uid;
  in_main_thread (owner_looked_up, c);
}

/* The bus's answer: C's user, then its person, counted. */
static void
caller_known (GDBusMethodInvocation *invocation, uid_t uid, pid_t pid,
              const char *err, gpointer data)
{
  struct call *c = data;
  char why[256];

  uid_lookups--;
  if (err) {
    call_fail (c, ERROR_FAILED, err);
    return;
  }
  c->uid = uid;
  c->pid = pid;
  if (mloop_caller_login (pid, uid, &c->person, why, sizeof why) == -1) {
    call_fail (c, ERROR_FAILED, why);
    return;
  }
  if (c->person == uid) {
    person_known (c);
    return;
  }
  if (owner_lookups >= MLOOP_MAX_OWNER_LOOKUPS) {
    snprintf (why, sizeof why, "the service is looking up the owners of "
              "%u callers' subordinate uids already: try again",
              owner_lookups);
    call_fail (c, ERROR_LIMIT, why);
    return;
  }
  owner_lookups++;
  g_thread_pool_push (owner_thread, c, NULL);
}

/* A new call of KIND: who makes it, then polkit's answer for ACTION. */
static void
start_call (GDBusMethodInvocation *invocation, enum call_kind kind,
            const char *action, const char *what, GVariant *options,
            gint32 handle)
{
  struct call *c = g_new0 (struct call, 1);
  char err[256];

  c->kind = kind;
  c->action = action;
  c->invocation = g_object_ref (invocation);
  c->what = g_strdup (what);
  c->options = options ? g_variant_ref (options) : NULL;
  c->handle = handle;
  if (uid_lookups >= MLOOP_MAX_UID_LOOKUPS) {
    snprintf (err, sizeof err, "the service is asking the bus who %u "
              "callers are already: try again", uid_lookups);
    call_fail (c, ERROR_LIMIT, err);
    return;
  }
  uid_lookups++;
  mloop_caller_uid (invocation, UID_LOOKUP_TIMEOUT_MS, caller_known, c);
}

static void
attach (GDBusMethodInvocation *invocation, GVariant *params)
{
  g_autoptr (GVariant) options = NULL;
  const char *name;
  gint32 handle;
  char err[1024];

  g_variant_get (params, "(h&s@a{sv})", &handle, &name, &options);
  /* The name first: a bad one is neither kept nor logged. */
  if (mloop_held_image_label_check (name, err, sizeof err) == -1 ||
      !options_known (options, err, sizeof err) ||
      !descriptors_passed (invocation, 1, &handle, err, sizeof err)) {
    reply_error (invocation, ERROR_INVALID, err);
    return;
  }
  start_call (invocation, CALL_ATTACH, MLOOP_ACTION_ATTACH, name, options,
              handle);
}

/* Whether WHAT, a detach's, names a device, a URI or an RBD image, or
 * is an absolute path: a relative one would be resolved from the
 * service's directory, not its caller's, and find what they did not
 * name.
 */
static bool
absolute_or_named (const char *what)
{
  bool ublk;

  return what[0] == '/' || mloop_device_index (what, &ublk) >= 0 ||
    strstr (what, "://") || mloop_is_rbd_name (what);
}

/* Nothing of DEVICE is looked at before polkit lets the caller detach,
 * but a name no path could have, a relative path, or a descriptor, is
 * refused before the call waits for polkit, keeping its message.
 */
static void
detach (GDBusMethodInvocation *invocation, GVariant *params)
{
  const char *what;
  size_t len;
  char err[256];

  g_variant_get (params, "(&s)", &what);
  len = strlen (what);
  if (len >= PATH_MAX)
    snprintf (err, sizeof err, "the device's or image's name is %zu bytes "
              "long: a path has at most %d", len, PATH_MAX - 1);
  else if (!absolute_or_named (what))
    snprintf (err, sizeof err, "%s: not a device's name nor an absolute "
              "path", what);
  if (len >= PATH_MAX || !absolute_or_named (what) ||
      !descriptors_passed (invocation, 0, NULL, err, sizeof err)) {
    reply_error (invocation, ERROR_INVALID, err);
    return;
  }
  start_call (invocation, CALL_DETACH, MLOOP_ACTION_DETACH, what, NULL, -1);
}

/* Lists waiting for the list thread, or in it: each holds its message.
 * Counted up in the main thread, down in the list thread.
 */
static gint lists_waiting;

/* The one thread that answers lists.  A list names each device's owner
 * from the user database, whose sources (LDAP, sssd) may be slow or
 * never answer: in the main loop, any user's list held up every call.
 * A lookup that never ends holds up only lists.
 */
static GThreadPool *list_thread;

static void
list_thread_run (gpointer data, gpointer unused)
{
  GDBusMethodInvocation *invocation = data;
  struct mloop_device_state *devices;
  g_autofree char *text = NULL;
  gboolean json;
  size_t n, size;
  FILE *f;

  g_variant_get (g_dbus_method_invocation_get_parameters (invocation), "(b)",
                 &json);
  devices = mloop_state_list (&n);
  f = open_memstream (&text, &size);
  if (f)
    mloop_describe_list (f, devices, n, json);
  mloop_state_free_list (devices, n);
  if (f == NULL || fclose (f) != 0)
    g_dbus_method_invocation_return_dbus_error (invocation, ERROR_FAILED,
                                                strerror (errno));
  else
    g_dbus_method_invocation_return_value (invocation,
                                           g_variant_new ("(s)", text));
  g_object_unref (invocation);
  g_atomic_int_add (&lists_waiting, -1);
}

/* Refused at once past MLOOP_MAX_LISTS_WAITING, and with a descriptor,
 * which a list waiting would keep open.
 */
static void
list (GDBusMethodInvocation *invocation, GVariant *params)
{
  char err[256];

  if (!descriptors_passed (invocation, 0, NULL, err, sizeof err)) {
    reply_error (invocation, ERROR_INVALID, err);
    return;
  }
  if (g_atomic_int_get (&lists_waiting) >= MLOOP_MAX_LISTS_WAITING) {
    snprintf (err, sizeof err, "the service has %d lists to answer "
              "already: try again", MLOOP_MAX_LISTS_WAITING);
    reply_error (invocation, ERROR_LIMIT, err);
    return;
  }
  g_atomic_int_inc (&lists_waiting);
  g_thread_pool_push (list_thread, g_object_ref (invocation), NULL);
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

void
mloop_manager_reap (void)
{
  if (!g_mutex_trylock (&device_work))
    return;
  while (waitpid (-1, NULL, WNOHANG) > 0)
    ;
  g_mutex_unlock (&device_work);
}

bool
mloop_manager_export (GDBusConnection *connection,
                      const struct mloop_manager_limits *with)
{
  static const GDBusInterfaceVTable vtable = { .method_call = method_call };
  g_autoptr (GBytes) xml = NULL;
  g_autoptr (GDBusNodeInfo) node = NULL;
  g_autoptr (GError) gerr = NULL;

  limits = *with;
  if (device_thread == NULL)
    device_thread = g_thread_pool_new (device_thread_run, NULL, 1, FALSE,
                                       &gerr);
  if (device_thread == NULL) {
    g_warning ("cannot start the device thread: %s", gerr->message);
    return false;
  }
  if (owner_thread == NULL)
    owner_thread = g_thread_pool_new (owner_thread_run, NULL, 1, FALSE,
                                      &gerr);
  if (owner_thread == NULL) {
    g_warning ("cannot start the owner lookup thread: %s", gerr->message);
    return false;
  }
  if (list_thread == NULL)
    list_thread = g_thread_pool_new (list_thread_run, NULL, 1, FALSE, &gerr);
  if (list_thread == NULL) {
    g_warning ("cannot start the list thread: %s", gerr->message);
    return false;
  }

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
