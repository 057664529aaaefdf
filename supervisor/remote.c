/* mloop-supervisor — the remote mode (remote.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "address.h"
#include "device_state.h"
#include "nbd_connect.h"
#include "dead_slots.h"
#include "nbd_netlink.h"
#include "nbd_proto.h"
#include "nbd_receivers.h"
#include "on_context.h"
#include "release_watch.h"
#include "remote.h"
#include "say.h"

#define MAX_CONNECTIONS 16
/* After an announcement: a server's death makes the kernel announce every
 * connection, so wait a little and answer them together.
 */
#define HEAL_DELAY_MS 100
/* While the export is unreachable: try again after 0.1 s, doubling up to
 * 2 s, so a restart of a few seconds costs the device at most 2 s more.
 */
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000
/* How often the kernel's receive works are counted, for dead slots whose
 * announcements were lost.
 */
#define CHECK_INTERVAL_MS 5000

struct remote_keeper {
  char *dir;
  char *uri;
  struct mloop_nbd_address address;
  struct dead_slots slots;
  struct release_watch release;
  int index;                    /* the device's, once its state exists */
  guint heal_source;
  unsigned backoff_ms;
  /* The failure streak under way: since when, how many tries, and the
   * error last logged (a streak logs once, and again if its cause
   * changes).
   */
  gint64 failing_since;
  unsigned attempts;
  char *logged_error;
  /* Receive works counted when an offer found no dead slot: the kernel
   * (Linux 6.1's rescuer) runs fewer than there are connections, and
   * the periodic look does not offer again until the count changes.
   */
  int quiet_receivers;
  gboolean receivers_named;     /* the kernel names them: counts mean it */
  struct remote_connect *connecting;  /* a heal's connect under way */
  unsigned reconnects;
  char *last_reconnect;
  char *last_failure;
  guint check_source;
  void (*released) (struct remote_keeper *rk, void *data);
  void *released_data;
  int released_lock;            /* autoclear: the kernel let the device go */
  FILE *log;
};

static void
record (struct remote_keeper *rk)
{
  struct mloop_supervisor_record r = {
    .last_failure = rk->last_failure, .reconnects = rk->reconnects,
    .last_reconnect = rk->last_reconnect,
  };
  char err[512];

  if (mloop_state_save_supervisor (rk->dir, &r, err, sizeof err) == -1)
    say_to (rk->log, "%s", err);
}

/* The device's index, once `mloop attach` has written its state. */
static int
device_index (void *data)
{
  struct remote_keeper *rk = data;
  struct mloop_device_state st;

  if (rk->index < 0 && mloop_state_load (rk->dir, &st) == 0) {
    rk->index = st.index;
    mloop_state_clear (&st);
  }
  return rk->index;
}

static gboolean heal (gpointer data);

static void
schedule_heal (struct remote_keeper *rk, unsigned ms)
{
  if (rk->heal_source == 0)
    rk->heal_source = g_timeout_add (ms, heal, rk);
}

/* Whether the export X is the one the device in ST was given: a size or
 * flags that changed would make the kernel's idea of the device wrong.
 */
static bool
export_matches (const struct mloop_device_state *st,
                const struct mloop_nbd_export *x, char *err, size_t errlen)
{
  uint16_t flags = x->flags | (st->read_only ? NBD_FLAG_READ_ONLY : 0);

  if (x->size != st->size)
    snprintf (err, errlen, "the export has %llu bytes now, the device "
              "%llu: not reconnecting it (detach it, or put the export "
              "back)", (unsigned long long) x->size,
              (unsigned long long) st->size);
  else if (flags != st->export_flags)
    snprintf (err, errlen, "the export's flags are 0x%x now, the device's "
              "0x%x: not reconnecting it (detach it, or put the export "
              "back)", flags, st->export_flags);
  else
    return true;
  return false;
}

/* A try that failed: said once per streak (and when its cause changes),
 * tried again with backoff.  The device keeps waiting until its
 * dead-connection timeout, then fails IO, and is still reconnected if
 * the export comes back later.
 */
static void
heal_failed (struct remote_keeper *rk, const struct mloop_device_state *st,
             const char *err)
{
  if (rk->failing_since == 0) {
    rk->failing_since = g_get_monotonic_time ();
    rk->attempts = 0;
  }
  rk->attempts++;
  if (rk->logged_error == NULL || strcmp (rk->logged_error, err) != 0) {
    say_to (rk->log, "/dev/nbd%d: cannot reconnect to %s: %s; trying again "
            "every %u ms at most (IO waits up to %u s, then fails with EIO)",
            st->index, rk->uri, err, BACKOFF_MAX_MS, st->dead_timeout);
    g_free (rk->logged_error);
    rk->logged_error = g_strdup (err);
    g_free (rk->last_failure);
    rk->last_failure = g_strdup (err);
    record (rk);
  }
  schedule_heal (rk, rk->backoff_ms);
  rk->backoff_ms = MIN (rk->backoff_ms * 2, BACKOFF_MAX_MS);
}

/* The kernel took DONE connections: the streak, if any, is over. */
static void
heal_done (struct remote_keeper *rk, const struct mloop_device_state *st,
           unsigned done)
{
  g_autofree char *outage = NULL;

  if (rk->failing_since != 0) {
    double s = (double) (g_get_monotonic_time () - rk->failing_since) /
      G_USEC_PER_SEC;

    outage = g_strdup_printf ("; %s was unreachable for %.1f s (%u tries)",
                              rk->uri, s, rk->attempts);
  }
  rk->failing_since = 0;
  rk->backoff_ms = BACKOFF_MIN_MS;
  g_clear_pointer (&rk->logged_error, g_free);
  if (done == 0)
    return;
  rk->reconnects += done;
  g_free (rk->last_reconnect);
  rk->last_reconnect = g_strdup_printf ("%u connection(s) to %s replaced%s",
                                       done, rk->uri, outage ? outage : "");
  say_to (rk->log, "/dev/nbd%d: reconnect: the kernel took %u new "
          "connection(s) in dead slots (%u in all)%s", st->index, done,
          rk->reconnects, outage ? outage : "");
  record (rk);
}

/* Offers the N negotiated sockets in FDS for dead slots, under the
 * device's lock so no detach of it is under way.  How many the kernel
 * took, -1 with ERR when it refused, or -2 when the lock is busy (try
 * again shortly).
 * *FULL says it had no dead slot left.
 */
static int
offer (struct remote_keeper *rk, int *fds, unsigned n, bool *full,
       char *err, size_t errlen)
{
  struct mloop_device_state st;
  int lock, r = 0, done = 0;

  *full = false;
  lock = mloop_state_lock_device (rk->dir, false);
  if (lock == -1 && errno == EWOULDBLOCK)
    return -2;
  /* A detach may have removed the device since it was looked at. */
  if (mloop_state_load (rk->dir, &st) == -1) {
    mloop_state_unlock (lock);
    *full = true;
    return 0;
  }
  for (unsigned i = 0; i < n && (r = mloop_nbd_netlink_replace_dead
                                 (st.index, mloop_state_backend (&st), fds[i],
                                  st.dead_timeout, err, errlen)) == 1; i++)
    done++;
  mloop_state_unlock (lock);
  mloop_state_clear (&st);
  *full = r == 0;
  return r < 0 && done == 0 ? -1 : done;
}

/* A connect to the export, on a thread of its own: a remote host may
 * take its whole connect timeout to answer, and in mloopd no other
 * device may wait for it.  The thread works on copies; the outcome
 * comes back on the keeper's main context.
 */
struct remote_connect {
  struct remote_keeper *rk;     /* NULL once the keeper stopped */
  char *uri;
  unsigned want;
  int fds[MAX_CONNECTIONS];
  int opened;
  struct mloop_nbd_export x;
  char err[512];
  GMainContext *context;
};

static gboolean connected (gpointer data);

static gpointer
connect_export (gpointer data)
{
  struct remote_connect *c = data;
  struct mloop_nbd_address a;

  c->opened = -1;
  if (mloop_nbd_address_parse (c->uri, MLOOP_NBD_ADDRESS_URI, &a, c->err,
                               sizeof c->err) == 0) {
    c->opened = mloop_nbd_connect (&a, c->want, false, c->fds, &c->x,
                                   c->err, sizeof c->err);
    mloop_nbd_address_clear (&a);
  }
  on_context_soon (c->context, connected, c);
  return NULL;
}

static void
remote_connect_free (struct remote_connect *c)
{
  if (c->opened > 0)
    mloop_nbd_close_all (c->fds, (unsigned) c->opened);
  g_main_context_unref (c->context);
  g_free (c->uri);
  g_free (c);
}

/* Answers the announcements: opens as many connections as slots were
 * announced dead (all of them when some announcements were lost) and
 * hands them to the kernel (connected).  Connecting happens without the
 * device's lock, so an unreachable host does not hold up its detach.
 */
static gboolean
heal (gpointer data)
{
  struct remote_keeper *rk = data;
  struct mloop_device_state st;
  struct remote_connect *c;
  g_autoptr (GError) gerr = NULL;
  GThread *thread;
  unsigned n, want;

  rk->heal_source = 0;
  /* One connect at a time: its end looks at the slots again. */
  if (rk->connecting)
    return G_SOURCE_REMOVE;
  /* No state: `mloop attach` is still connecting the device itself. */
  if (mloop_state_load (rk->dir, &st) == -1) {
    dead_slots_forget (&rk->slots);
    return G_SOURCE_REMOVE;
  }
  n = st.connections > 0 && st.connections <= MAX_CONNECTIONS
    ? st.connections : 1;
  want = dead_slots_wanted (&rk->slots, n);
  mloop_state_clear (&st);
  if (want == 0)
    return G_SOURCE_REMOVE;
  c = g_new0 (struct remote_connect, 1);
  c->rk = rk;
  c->uri = g_strdup (rk->uri);
  c->want = want;
  c->context = g_main_context_ref_thread_default ();
  thread = g_thread_try_new ("remote-connect", connect_export, c, &gerr);
  if (thread == NULL) {
    remote_connect_free (c);
    if (mloop_state_load (rk->dir, &st) == 0) {
      heal_failed (rk, &st, gerr->message);
      mloop_state_clear (&st);
    }
    return G_SOURCE_REMOVE;
  }
  g_thread_unref (thread);
  rk->connecting = c;
  return G_SOURCE_REMOVE;
}

/* A connect's outcome: the new connections offered to the kernel. */
static gboolean
connected (gpointer data)
{
  struct remote_connect *c = data;
  struct remote_keeper *rk = c->rk;
  struct mloop_device_state st;
  char err[512];
  bool full;
  int opened = c->opened, took;

  if (rk == NULL) {
    remote_connect_free (c);
    return G_SOURCE_REMOVE;
  }
  rk->connecting = NULL;
  /* Detached meanwhile. */
  if (mloop_state_load (rk->dir, &st) == -1) {
    dead_slots_forget (&rk->slots);
    remote_connect_free (c);
    return G_SOURCE_REMOVE;
  }
  if (opened > 0 && !export_matches (&st, &c->x, err, sizeof err)) {
    mloop_nbd_close_all (c->fds, (unsigned) opened);
    c->opened = opened = -1;
  }
  else if (opened < 0)
    snprintf (err, sizeof err, "%s", c->err);
  if (opened < 0) {
    heal_failed (rk, &st, err);
    goto out;
  }
  took = offer (rk, c->fds, (unsigned) opened, &full, err, sizeof err);
  if (took == -2) {
    schedule_heal (rk, HEAL_DELAY_MS);
    goto out;
  }
  if (took == -1) {
    heal_failed (rk, &st, err);
    goto out;
  }
  heal_done (rk, &st, (unsigned) took);
  if (full) {
    if (took == 0)
      rk->quiet_receivers = (int) mloop_nbd_receivers (st.index);
    dead_slots_forget (&rk->slots);
  }
  else {
    /* The export took fewer connections than asked (no multi-conn):
     * the rest next, at once.
     */
    rk->slots.count = c->want - (unsigned) took;
    schedule_heal (rk, HEAL_DELAY_MS);
  }
out:
  mloop_state_clear (&st);
  remote_connect_free (c);
  return G_SOURCE_REMOVE;
}

/* Dead slots whose announcements were lost: fewer receive works than
 * connections.  Only on a kernel that names them (nbd_receivers.h), and
 * not again for a count an offer already found without a dead slot.
 */
static gboolean
check (gpointer data)
{
  struct remote_keeper *rk = data;
  struct mloop_device_state st;
  unsigned running;

  if (rk->heal_source != 0 || rk->connecting ||
      mloop_state_load (rk->dir, &st) == -1)
    return G_SOURCE_CONTINUE;
  running = mloop_nbd_receivers (st.index);
  if (running > 0)
    rk->receivers_named = TRUE;
  if (rk->receivers_named && running < st.connections &&
      (int) running != rk->quiet_receivers) {
    rk->slots.lost = TRUE;
    schedule_heal (rk, 0);
  }
  if ((int) running != rk->quiet_receivers && running >= st.connections)
    rk->quiet_receivers = -1;
  mloop_state_clear (&st);
  return G_SOURCE_CONTINUE;
}

static void
heal_soon (void *data)
{
  struct remote_keeper *rk = data;

  schedule_heal (rk, HEAL_DELAY_MS);
}

static void
on_released (int lock, void *data)
{
  struct remote_keeper *rk = data;

  say_to (rk->log, "/dev/nbd%d was closed by its last user: autoclear",
          device_index (rk));
  rk->released_lock = lock;
  rk->released (rk, rk->released_data);
}

struct remote_keeper *
remote_keeper_new (const char *dir, const char *uri, FILE *log,
                   void (*released) (struct remote_keeper *rk, void *data),
                   void *data, char *err, size_t errlen)
{
  struct remote_keeper *rk = g_new0 (struct remote_keeper, 1);

  rk->index = -1;
  rk->backoff_ms = BACKOFF_MIN_MS;
  rk->quiet_receivers = -1;
  rk->released_lock = -1;
  rk->log = log;
  rk->released = released;
  rk->released_data = data;
  rk->dir = g_strdup (dir);
  rk->uri = g_strdup (uri);
  if (mloop_nbd_address_parse (uri, MLOOP_NBD_ADDRESS_URI, &rk->address,
                               err, errlen) == -1) {
    g_free (rk->dir);
    g_free (rk->uri);
    g_free (rk);
    return NULL;
  }
  dead_slots_listen (&rk->slots, device_index, heal_soon, rk,
                     "dead connections are found by counting receive "
                     "works only", log);
  rk->check_source = g_timeout_add (CHECK_INTERVAL_MS, check, rk);
  release_watch_start (&rk->release, rk->dir, on_released, rk);
  record (rk);
  say_to (log, "supervising the device on %s", uri);
  return rk;
}

void
remote_keeper_stop (struct remote_keeper *rk)
{
  say_to (rk->log, "stopping");
  if (rk->connecting)
    rk->connecting->rk = NULL;  /* its end closes what it opened */
  if (rk->heal_source != 0)
    g_source_remove (rk->heal_source);
  g_source_remove (rk->check_source);
  release_watch_stop (&rk->release);
  dead_slots_close (&rk->slots);
  mloop_nbd_address_clear (&rk->address);
  if (rk->released_lock != -1) {
    mloop_state_remove (rk->dir);
    mloop_state_unlock (rk->released_lock);
  }
  g_free (rk->logged_error);
  g_free (rk->last_reconnect);
  g_free (rk->last_failure);
  g_free (rk->uri);
  g_free (rk->dir);
  g_free (rk);
}
