/* mloop-supervisor — a keeper keeps the server of one attached device
 * alive (keeper.h).
 *
 * `mloop attach` starts the device's first server beside the supervisor
 * as its child (--adopt, device/side_by_side.c); the keeper watches that
 * server and, whenever it dies, starts a new one with backoff and hands
 * the kernel fresh connections to it (NBD_CMD_RECONFIGURE).  The device
 * is attached with a dead-connection timeout, so while the server is
 * down the kernel holds IO instead of failing it; requests that were in
 * flight on the dead connections are requeued by the kernel when their
 * request timeout expires.
 *
 * It also heals connections the kernel dropped while the server lives:
 * when a request outlives the request timeout (a slow disk under the
 * image), the kernel shuts that connection down and marks its slot dead,
 * and after a few such timeouts every slot would be dead and all IO would
 * fail.  The kernel announces each dead slot (NBD_CMD_LINK_DEAD,
 * nbd_events.h); the keeper answers with one new negotiated
 * connection per announcement, each a reconfigure of its own, which the
 * kernel puts in a dead slot.  A server that died is the restart's
 * business instead, which hands the kernel a whole new set.
 *
 * keeper_restart_server is a planned restart (SIGUSR1 to the
 * supervisor): `mloop resize` of a device served by nbdkit, which keeps
 * the export size each connection negotiated.
 * The next server is started first, on a socket of its own, and only
 * once it listens is the old one killed, its socket replaced by the new
 * one (rename) and the kernel handed new connections, which negotiate
 * the new size.  So the kernel is without a live connection only for the
 * moment the handover takes, never for a server's start (nbdkit in a TCG
 * guest can take longer to start than the dead-connection timeout).  The
 * old server gets SIGKILL, not SIGTERM: a stopping nbdkit answers the
 * requests it has read but not started with ESHUTDOWN, which the kernel
 * fails as IO errors (measured: ext4 aborted its journal).  Killed, it
 * answers nothing more; the kernel requeues what was in flight when the
 * request timeout expires, as after any death, and a write sent again is
 * only written again.  It is not counted as a failure.
 *
 * Only the first server may make the device's overlay (none at its
 * path); every later start (a restart, a planned restart, the next
 * service's) is told it must exist (spec.overlay_must_exist).  Gone by
 * then (removed, renamed away), a new empty one would have the device,
 * a filesystem mounted on it, read the base where its writes were: the
 * start is refused instead, its reason in the log, and the kernel holds
 * IO until its dead-connection timeout fails it.  A restart keeps
 * trying with backoff, so the overlay put back is served again.
 *
 * For an RBD image it also follows resizes made elsewhere (`rbd
 * resize`): every SIZE_POLL_S it asks the server's socket for the size,
 * which the server learns from librbd, and gives a new one to the
 * kernel as `mloop resize` would (resize.h, mloop_resize_follow).
 *
 * It records restarts and reconnects in the directory's "supervisor"
 * file for `mloop status`, and logs to the device's log.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "dead_slots.h"
#include "device_state.h"
#include "hosted_start.h"
#include "keeper.h"
#include "kernel_log.h"
#include "nbd_connect.h"
#include "nbd_netlink.h"
#include "nbd_receivers.h"
#include "overlay_witness.h"
#include "release_watch.h"
#include "resize.h"
#include "say.h"
#include "server_process.h"
#include "server_start.h"
#include "store_name.h"

#define START_TIMEOUT_MS 60000
#define STOP_TIMEOUT_MS 10000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 8000
/* A server that lived this long earns a quick restart again. */
#define HEALTHY_US (30 * G_USEC_PER_SEC)
/* Reconnecting a connection the kernel dropped: wait this long after an
 * announcement, so a burst is answered at once and a server's death
 * (which makes the kernel announce every connection) is seen first.
 */
#define HEAL_DELAY_MS 100
#define HEAL_RETRY_MIN_MS 1000
#define HEAL_RETRY_MAX_MS 8000
/* After reconnecting: how long to look for the new receive works. */
#define RECEIVERS_SETTLE_MS 500
#define RECEIVERS_TIMEOUT_MS 2000
/* How often an RBD device's server is asked for the image's size: a
 * resize made elsewhere (`rbd resize`) reaches the server through
 * librbd's update watch, and the kernel only through us.
 */
#define SIZE_POLL_S 2

struct keeper {
  struct mloop_server_spec spec;
  /* The strings spec points to, ours. */
  char *image, *overlay, *socket_path, *pid_file, *log_file, *stats_file,
    *lock_record;
  char *dir;
  pid_t server;
  int pidfd;
  gint64 started_at;
  unsigned restarts;
  char *last_failure;
  unsigned backoff_ms;
  /* From a server's death until its successor serves the device. */
  gboolean restarting;
  guint pidfd_source;           /* watches pidfd for on_server_exit */
  /* Connections the kernel dropped while the server lived. */
  struct dead_slots slots;
  int index;                    /* the device's, once its state exists */
  guint heal_source;
  unsigned heal_retry_ms;
  unsigned reconnects;
  char *last_reconnect;
  unsigned handovers;           /* planned restarts finished */
  char *handover_error;         /* why the last one failed, or NULL */
  const char *kernel_reason;    /* the last reason it gave, and when */
  gint64 kernel_reason_at;
  guint restart_source;         /* the next try at a server */
  guint size_source;            /* an RBD device's look at its image's size */
  struct release_watch release;
  void (*released) (struct keeper *k, void *data);
  void *released_data;
  int released_lock;            /* autoclear: the kernel let the device go */
  FILE *log;
  char *size_refusal;           /* why the device did not follow, once said */
  /* A server starting on a thread of its own (server_start.h): the
   * first (keeper_start_async) or a restart after a death.
   */
  struct server_start *starting;
  keeper_started_fn started;    /* keeper_start_async's, until called */
  void *started_data;
  /* keeper_start_async's server replaces one that died while no keeper
   * ran (keeper_take_over_new): the device is handed connections to it.
   */
  gboolean reconnect_started;
  /* A planned restart's next server is the one starting; the old one. */
  gboolean replacing;
  pid_t replaced;
  /* spec.in_process: the server is in this process (hosted_server.h),
   * or being opened; it does not die alone, so there is no pid to watch
   * and no restart but the next service's.
   */
  struct hosted_server *hosted;
  /* The overlay's witness (overlay_witness.h), checked after each
   * server's exit before the next opens it: opened once the first
   * serves, for servers in processes of their own only; or NULL.
   */
  struct overlay_witness *witness;
  struct hosted_start *hosting;
};

static void
record (struct keeper *k)
{
  struct mloop_supervisor_record r = {
    .server_pid = keeper_server_pid (k), .restarts = k->restarts,
    .last_failure = k->last_failure, .reconnects = k->reconnects,
    .last_reconnect = k->last_reconnect, .handovers = k->handovers,
    .handover_error = k->handover_error,
  };
  char err[512];

  if (mloop_state_save_supervisor (k->dir, &r, err, sizeof err) == -1)
    say_to (k->log, "%s", err);
}

static gboolean on_server_exit (gint fd, GIOCondition c, gpointer data);
static void handover_done (struct keeper *k, const char *error);

/* Watches k->server: its pidfd wakes on_server_exit.  0, or -1 with ERR. */
static int
watch_server (struct keeper *k, char *err, size_t errlen)
{
  k->pidfd = (int) syscall (SYS_pidfd_open, k->server, 0);
  if (k->pidfd == -1) {
    snprintf (err, errlen, "pidfd_open: %s", strerror (errno));
    return -1;
  }
  k->pidfd_source = g_unix_fd_add (k->pidfd, G_IO_IN, on_server_exit, k);
  k->started_at = g_get_monotonic_time ();
  record (k);
  return 0;
}

/* A killed server leaves its pid file and socket behind: the pid file
 * would look like the new server's, and the socket path must be free.
 */
static void
clear_last_server (struct keeper *k)
{
  g_unlink (k->spec.pid_file);
  g_unlink (k->spec.socket_path);
}

/* Starts a server and watches it; ADOPTED, when not 0, is the first
 * one, started beside us as our child (mloop_supervisor_start): then
 * only waits for it to listen.  0, or -1 with ERR.
 */
static int
start_server (struct keeper *k, pid_t adopted, char *err, size_t errlen)
{
  int r;

  if (adopted > 0)
    r = mloop_server_await (&k->spec, adopted, START_TIMEOUT_MS, &k->server,
                            err, errlen);
  else {
    clear_last_server (k);
    r = mloop_server_start (&k->spec, START_TIMEOUT_MS, &k->server,
                            err, errlen);
  }
  if (r == -1)
    return -1;
  if (watch_server (k, err, errlen) == -1) {
    mloop_server_stop (k->server, k->spec.socket_path, STOP_TIMEOUT_MS);
    return -1;
  }
  return 0;
}

/* Hands the kernel fresh connections to the new server.  Before the
 * device's state exists, `mloop attach` is still connecting it itself.
 */
static int
reconnect_device (struct keeper *k, char *err, size_t errlen)
{
  struct mloop_device_state st;
  struct mloop_nbd_export x;
  int fds[16];
  unsigned n;
  int r;

  if (mloop_state_load (k->dir, &st) == -1)
    return 0;
  n = st.connections > 0 && st.connections <= 16 ? st.connections : 1;
  if (mloop_nbd_connect_unix (k->spec.socket_path, n, fds, &x,
                              err, errlen) == -1) {
    mloop_state_clear (&st);
    return -1;
  }
  r = mloop_nbd_netlink_reconfigure (st.index, mloop_state_backend (&st),
                                     fds, n, st.dead_timeout, err, errlen);
  mloop_nbd_close_all (fds, n);
  if (r == 0)
    say_to (k->log, "server pid %d serves /dev/nbd%d again over %u "
            "connections", (int) k->server, st.index, n);
  mloop_state_clear (&st);
  return r < 0 ? -1 : 0;
}

static gboolean restart (gpointer data);

/* The next try at a server after BACKOFF_MS, unless one is due. */
static void
schedule_restart (struct keeper *k)
{
  if (k->restart_source == 0)
    k->restart_source = g_timeout_add (k->backoff_ms, restart, k);
}

static void restarted (pid_t pid, const char *start_err, void *data);

/* A try at a server after a death: started on a thread of its own
 * (server_start.h), so a server slow to listen holds up no other device
 * of the process; restarted goes on once it listens.
 */
static gboolean
start_next_server (gpointer data)
{
  struct keeper *k = data;
  char err[1024];

  clear_last_server (k);
  k->spec.overlay_must_exist = true;
  k->starting = server_start_begin (&k->spec, 0, START_TIMEOUT_MS,
                                    restarted, k, err, sizeof err);
  if (k->starting == NULL)
    restarted (0, err, k);
  return G_SOURCE_REMOVE;
}

/* The next try at a server, once the overlay's witness has checked
 * what the last one to open it (a server that died, one that died
 * starting) may have taken with it: the next opener must find the mark.
 */
static gboolean
restart (gpointer data)
{
  struct keeper *k = data;

  k->restart_source = 0;
  /* A check under way starts the server when done. */
  if (overlay_witness_busy (k->witness))
    return G_SOURCE_REMOVE;
  if (!overlay_witness_check (k->witness, start_next_server, k))
    start_next_server (k);
  return G_SOURCE_REMOVE;
}

static void
restarted (pid_t pid, const char *start_err, void *data)
{
  struct keeper *k = data;
  char err[1024];

  k->starting = NULL;
  k->server = pid;
  if (pid <= 0)
    snprintf (err, sizeof err, "%s", start_err);
  else if (watch_server (k, err, sizeof err) == -1) {
    mloop_server_stop (pid, k->spec.socket_path, STOP_TIMEOUT_MS);
    k->server = 0;
  }
  if (k->server > 0 && reconnect_device (k, err, sizeof err) == 0) {
    /* The new set filled every dead slot: what was announced is done. */
    k->restarting = FALSE;
    dead_slots_forget (&k->slots);
    k->heal_retry_ms = HEAL_RETRY_MIN_MS;
    if (k->heal_source != 0) {
      g_source_remove (k->heal_source);
      k->heal_source = 0;
    }
    return;
  }
  say_to (k->log, "restart failed: %s", err);
  g_free (k->last_failure);
  k->last_failure = g_strdup (err);
  record (k);
  if (k->server > 0 && k->pidfd != -1)
    /* It started but the device could not reach it: try again whole. */
    kill (k->server, SIGKILL);
  else
    schedule_restart (k);
  k->backoff_ms = MIN (k->backoff_ms * 2, BACKOFF_MAX_MS);
}

static gboolean
on_server_exit (gint fd, GIOCondition c, gpointer data)
{
  struct keeper *k = data;
  g_autofree char *how = NULL;
  int status;

  /* Ours to reap: our child, or adopted as subreaper; not one a
   * process before us started (keeper_take_over).
   */
  if (waitpid (k->server, &status, WNOHANG) == k->server)
    how = describe_exit (status);
  else
    how = g_strdup ("ended (not our child: how is not known)");
  close (k->pidfd);
  k->pidfd = -1;
  k->pidfd_source = 0;
  g_free (k->last_failure);
  k->last_failure = g_strdup_printf ("server pid %d %s", (int) k->server,
                                     how);
  if (k->replacing) {
    /* The next server would take over from a dead one: the ordinary
     * restart does that, from scratch.
     */
    server_start_abandon (k->starting, false);
    k->starting = NULL;
    k->replacing = FALSE;
    handover_done (k, "the server died during the planned restart; it is "
                   "being restarted");
  }
  if (g_get_monotonic_time () - k->started_at > HEALTHY_US)
    k->backoff_ms = BACKOFF_MIN_MS;
  k->server = 0;
  k->restarting = TRUE;
  k->restarts++;
  say_to (k->log, "%s; restart %u in %u ms", k->last_failure, k->restarts,
          k->backoff_ms);
  record (k);
  schedule_restart (k);
  return G_SOURCE_REMOVE;
}

/* --- Connections the kernel dropped while the server lives ------------ */

/* The device's index, once `mloop attach` has written its state. */
static int
device_index (void *data)
{
  struct keeper *k = data;
  struct mloop_device_state st;

  if (k->index < 0 && mloop_state_load (k->dir, &st) == 0) {
    k->index = st.index;
    mloop_state_clear (&st);
  }
  return k->index;
}

/* Whether the server serves, with no restart under way: its pidfd is not
 * readable yet (a death the main loop has not seen is still a death).
 */
static bool
server_serving (const struct keeper *k)
{
  struct pollfd p = { .fd = k->pidfd, .events = POLLIN };

  if (k->spec.in_process)
    return k->hosted != NULL;
  return k->server > 0 && k->pidfd != -1 && !k->restarting &&
    poll (&p, 1, 0) == 0;
}

/* Why the kernel dropped a connection of /dev/nbdINDEX, from the lines
 * its nbd client logged since the last look (kernel_log.h); *LINE gets
 * the kernel's words.  The kernel rate-limits these lines (10 per 5 s),
 * so when it said nothing new the reason it gave within the last
 * STICKY_US stands.  NULL when it said none.
 */
static const char *
kernel_reason (struct keeper *k, int index, gint64 sticky_us, char **line)
{
  const char *reason = kernel_log_reason (index, line);

  if (reason) {
    k->kernel_reason = reason;
    k->kernel_reason_at = g_get_monotonic_time ();
  }
  else if (k->kernel_reason == NULL ||
           g_get_monotonic_time () - k->kernel_reason_at > sticky_us)
    return NULL;
  return k->kernel_reason;
}

/* One new connection, offered for a dead slot of the device in ST:
 * 1 if the kernel took it, 0 if it had no dead slot, -1 with ERR.
 */
static int
replace_one (struct keeper *k, const struct mloop_device_state *st,
             char *err, size_t errlen)
{
  struct mloop_nbd_export x;
  int fd, r;

  if (mloop_nbd_connect_unix (k->spec.socket_path, 1, &fd, &x,
                              err, errlen) == -1)
    return -1;
  if (x.size != st->size) {
    close (fd);
    snprintf (err, errlen, "the server's export has %llu bytes, the "
              "device %llu", (unsigned long long) x.size,
              (unsigned long long) st->size);
    return -1;
  }
  r = mloop_nbd_netlink_replace_dead (st->index, mloop_state_backend (st),
                                      fd, st->dead_timeout, err, errlen);
  close (fd);
  return r < 0 ? -1 : r;
}

/* Every slot has a reader again?  On Linux 6.1 a receive work can wait
 * for a kworker (docs/design.md, "A request held for the whole
 * timeout"); a connection nobody reads times out and is dropped again,
 * so this is said, not acted on.
 */
static void
check_receivers (struct keeper *k, const struct mloop_device_state *st,
                 unsigned n)
{
  if (!mloop_nbd_receivers_all_running (st->index, n, RECEIVERS_SETTLE_MS,
                                        RECEIVERS_TIMEOUT_MS))
    say_to (k->log, "/dev/nbd%d: %u of %u connections have a receive work "
            "running after the reconnect; requests on the others will time "
            "out and the kernel will drop them again", st->index,
            mloop_nbd_receivers (st->index), n);
}

static gboolean heal (gpointer data);

static void
schedule_heal (struct keeper *k, unsigned ms)
{
  if (k->heal_source == 0)
    k->heal_source = g_timeout_add (ms, heal, k);
}

/* Answers the announcements: as many new connections as slots were
 * announced dead (all of them when announcements were lost), one
 * reconfigure each, until the kernel has no dead slot left.
 */
static gboolean
heal (gpointer data)
{
  struct keeper *k = data;
  struct mloop_device_state st;
  g_autofree char *said = NULL;
  const char *reason;
  unsigned n, want, done = 0;
  char err[512];
  int r = 1, lock;

  k->heal_source = 0;
  /* A server that died: the restart hands the kernel a whole new set. */
  if (!server_serving (k)) {
    dead_slots_forget (&k->slots);
    return G_SOURCE_REMOVE;
  }
  /* An attach, detach or resize of this device is under way: after
   * it.  A detach must not find its device given a new connection after
   * its disconnect (the kernel would take it into a slot the disconnect
   * killed, and clear its "disconnected" mark).
   */
  lock = mloop_state_lock_device (k->dir, false);
  if (lock == -1 && errno == EWOULDBLOCK) {
    schedule_heal (k, HEAL_DELAY_MS);
    return G_SOURCE_REMOVE;
  }
  /* No state yet: `mloop attach` is still connecting the device. */
  if (mloop_state_load (k->dir, &st) == -1) {
    mloop_state_unlock (lock);
    dead_slots_forget (&k->slots);
    return G_SOURCE_REMOVE;
  }
  n = st.connections > 0 ? st.connections : 1;
  want = dead_slots_wanted (&k->slots, n);
  /* A request timeout's storm lasts about two timeouts. */
  reason = kernel_reason (k, st.index,
                          2 * (gint64) st.timeout * G_USEC_PER_SEC, &said);
  while (done < want && (r = replace_one (k, &st, err, sizeof err)) == 1) {
    done++;
    k->reconnects++;
    g_free (k->last_reconnect);
    k->last_reconnect = g_strdup_printf ("connection dropped by the kernel "
                                         "(%s)", reason ? reason :
                                         "cause not in the kernel log");
    say_to (k->log, "/dev/nbd%d: %s%s%s%s while server pid %d serves; "
            "reconnect %u gave the kernel a new connection in its place",
            st.index,
            k->last_reconnect, said ? " [kernel: \"" : "", said ? said : "",
            said ? "\"]" : "", (int) k->server, k->reconnects);
  }
  if (r == 0 && done == 0)
    /* A restart (planned or not) replaced them before this ran. */
    say_to (k->log, "/dev/nbd%d: the %u connection(s) the kernel announced "
            "dead had been replaced already", st.index, want);
  else if (r == 0)
    /* NBD_CMD_RECONFIGURE answered 0 without taking the socket. */
    say_to (k->log, "/dev/nbd%d: the kernel has no dead connection left "
            "(it took %u of %u; the next reconfigure was answered 0 and its "
            "socket dropped)", st.index, done, want);
  if (r == -1) {
    say_to (k->log, "/dev/nbd%d: reconnecting a dropped connection failed: "
            "%s; again in %u ms", st.index, err, k->heal_retry_ms);
    k->slots.count = want - done;
    schedule_heal (k, k->heal_retry_ms);
    k->heal_retry_ms = MIN (k->heal_retry_ms * 2, HEAL_RETRY_MAX_MS);
  } else {
    dead_slots_forget (&k->slots);
    k->heal_retry_ms = HEAL_RETRY_MIN_MS;
  }
  mloop_state_unlock (lock);
  if (done > 0) {
    record (k);
    check_receivers (k, &st, n);
  }
  mloop_state_clear (&st);
  return G_SOURCE_REMOVE;
}

static void
heal_soon (void *data)
{
  struct keeper *k = data;

  schedule_heal (k, HEAL_DELAY_MS);
}


static void replace_server (struct keeper *k);

/* An nbdkit's part in following a resize (mloop_restart_fn). */
static int
restart_for_size (void *data, char *err, size_t errlen)
{
  struct keeper *k = data;

  replace_server (k);
  if (k->handover_error == NULL)
    return 0;
  snprintf (err, errlen, "%s", k->handover_error);
  return -1;
}

/* An RBD image resized elsewhere: the device follows (resize.h). */
static gboolean
follow_image_size (gpointer data)
{
  struct keeper *k = data;
  const struct mloop_restart restart = { restart_for_size, k };
  uint64_t from = 0, to = 0;
  char err[512];
  int r;

  if (k->restarting || k->replacing)
    return G_SOURCE_CONTINUE;
  r = mloop_resize_follow (k->dir, &restart, &from, &to, err,
                           sizeof err);
  if (r == 1) {
    say_to (k->log, "/dev/nbd%d: the image was resized elsewhere; the "
            "device follows, %" PRIu64 " -> %" PRIu64 " bytes",
            device_index (k), from, to);
    g_clear_pointer (&k->size_refusal, g_free);
  }
  else if (r == -1 && g_strcmp0 (err, k->size_refusal) != 0) {
    say_to (k->log, "/dev/nbd%d: the image was resized elsewhere, but the "
            "device keeps its size: %s", device_index (k), err);
    g_free (k->size_refusal);
    k->size_refusal = g_strdup (err);
  }
  return G_SOURCE_CONTINUE;
}

/* An autoclear device's last user closed it and the kernel disconnected
 * it: the owner stops the keeper, which removes the device's directory
 * (under LOCK) on the way out.
 */
static void
on_released (int lock, void *data)
{
  struct keeper *k = data;

  say_to (k->log, "/dev/nbd%d was closed by its last user: autoclear",
          device_index (k));
  k->released_lock = lock;
  k->released (k, k->released_data);
}

/* Kills the old server and waits until it is gone: it is our child, or
 * was adopted (nbdkit's daemon), so its pidfd says when.
 */
static void
kill_old_server (pid_t pid, int pidfd)
{
  struct pollfd p = { .fd = pidfd, .events = POLLIN };

  kill (pid, SIGKILL);
  poll (&p, 1, STOP_TIMEOUT_MS);
  waitpid (pid, NULL, WNOHANG);
  close (pidfd);
}

/* A planned restart is over: `mloop resize` waits for this record (the
 * count, and why it failed if it did) before it tells the kernel the new
 * size, because on Linux 6.9 and later that freezes the device's queue
 * under the lock a reconnect needs: sent while the kernel waits for the
 * new connections, it would hold them off until the requests failed.
 */
static void
handover_done (struct keeper *k, const char *error)
{
  k->handovers++;
  g_free (k->handover_error);
  k->handover_error = error ? g_strdup (error) : NULL;
  record (k);
}

/* The paths of a planned restart's next server: the device's own, with
 * ".next".  Its command line names SOCKET.next, which contains SOCKET,
 * so mloop_server_running still knows it by the device's socket path.
 * Its counters are its own: until the old server dies, both count, and
 * a connection the old one counted open when it was killed would never
 * be counted closed (mloop status: 5 of 4 connections open).
 */
struct next_paths {
  char *sock, *pid_file, *stats;
};

static void
next_paths_init (const struct keeper *k, struct next_paths *n)
{
  n->sock = g_strconcat (k->spec.socket_path, ".next", NULL);
  n->pid_file = g_strconcat (k->spec.pid_file, ".next", NULL);
  n->stats = g_strconcat (k->spec.stats_file, ".next", NULL);
}

static void
next_paths_clear (struct next_paths *n)
{
  g_free (n->sock);
  g_free (n->pid_file);
  g_free (n->stats);
}

/* An RBD image's exclusive lock has one holder: started first, the next
 * server would break the lock of one still answering requests (librbd
 * blocklists it, failing the writes it has in flight).  So the old one
 * goes first, as in a crash; the next takes its lock over at once
 * (lock_record) while the kernel holds IO.
 */
static bool
old_goes_first (const struct keeper *k)
{
  return k->spec.lock_record != NULL;
}

/* A planned restart's first half (see the top): the next server's spec,
 * on its own paths, cleared of a last try's; with old_goes_first the old
 * server is killed now.  The old server's pid, which the caller passes
 * to replace_finish.
 */
static pid_t
replace_begin (struct keeper *k, struct next_paths *paths,
               struct mloop_server_spec *next)
{
  pid_t old = k->server;

  next_paths_init (k, paths);
  *next = k->spec;
  next->overlay_must_exist = true;
  next->socket_path = paths->sock;
  next->pid_file = paths->pid_file;
  next->stats_file = paths->stats;
  g_unlink (paths->sock);
  g_unlink (paths->pid_file);
  g_unlink (paths->stats);
  if (old_goes_first (k)) {
    g_source_remove (k->pidfd_source);
    kill_old_server (old, k->pidfd);
    k->server = 0;
    k->pidfd = -1;
  }
  return old;
}

/* A planned restart's second half, once the next server listens (PID)
 * or did not start (0, START_ERR): the handover, or the old server
 * serving on (or, when it went first, a restart).  If the next server
 * does not start, the old one serves on and `mloop resize` says so.
 */
static void
replace_finish (struct keeper *k, pid_t old, pid_t pid, const char *start_err)
{
  g_autofree char *failed = NULL;
  struct next_paths paths;
  char err[512];

  next_paths_init (k, &paths);
  if (pid <= 0) {
    if (!old_goes_first (k)) {
      failed = g_strdup_printf ("the next server did not start: %s; server "
                                "pid %d serves on", start_err, (int) old);
      goto out;
    }
    failed = g_strdup_printf ("the next server did not start: %s; "
                              "restarting it", start_err);
    k->restarting = TRUE;
    schedule_restart (k);
    goto out;
  }
  if (!old_goes_first (k)) {
    g_source_remove (k->pidfd_source);
    kill_old_server (old, k->pidfd);
  }
  k->server = pid;
  if (watch_server (k, err, sizeof err) == -1) {
    failed = g_strdup (err);
    mloop_server_stop (pid, paths.sock, STOP_TIMEOUT_MS);
    k->server = 0;
    k->restarting = TRUE;
    schedule_restart (k);
    goto out;
  }
  /* From here a failure kills the new server: its death starts the
   * ordinary restart, which begins from scratch.
   */
  if (rename (paths.sock, k->spec.socket_path) == -1 ||
      rename (paths.pid_file, k->spec.pid_file) == -1 ||
      rename (paths.stats, k->spec.stats_file) == -1) {
    failed = g_strdup_printf ("renaming %s: %s", paths.sock, strerror (errno));
    kill (pid, SIGKILL);
    goto out;
  }
  /* The kernel takes new sockets only into slots it has marked dead,
   * which it does as each old connection's receive work fails.
   */
  if (device_index (k) >= 0)
    mloop_nbd_receivers_wait_gone (device_index (k), RECEIVERS_TIMEOUT_MS);
  if (reconnect_device (k, err, sizeof err) == -1) {
    failed = g_strdup_printf ("reconnecting the device failed: %s", err);
    kill (pid, SIGKILL);
    goto out;
  }
  say_to (k->log, "server pid %d replaced server pid %d (planned restart: "
          "the image was resized)", (int) pid, (int) old);
out:
  next_paths_clear (&paths);
  if (failed)
    say_to (k->log, "planned restart: %s", failed);
  handover_done (k, failed);
}

/* A planned restart waited for in the loop: an RBD image resized
 * elsewhere, whose follower (mloop_resize_follow) goes on only once the
 * kernel is connected to the next server.
 */
static void
replace_server (struct keeper *k)
{
  struct next_paths paths;
  struct mloop_server_spec next;
  pid_t old = replace_begin (k, &paths, &next), pid;
  char err[512];

  if (mloop_server_start (&next, START_TIMEOUT_MS, &pid, err,
                          sizeof err) == -1)
    pid = 0;
  next_paths_clear (&paths);
  replace_finish (k, old, pid, err);
}

static void
next_started (pid_t pid, const char *start_err, void *data)
{
  struct keeper *k = data;

  k->starting = NULL;
  k->replacing = FALSE;
  replace_finish (k, k->replaced, pid, start_err);
}

/* A planned restart asked for (`mloop resize`, which waits for its
 * record): the next server's start waits on a thread of its own
 * (server_start.h), as a first start does.
 */
static void
replace_server_async (struct keeper *k)
{
  struct next_paths paths;
  struct mloop_server_spec next;
  char err[1024];

  k->replaced = replace_begin (k, &paths, &next);
  k->replacing = TRUE;
  k->starting = server_start_begin (&next, 0, START_TIMEOUT_MS, next_started,
                                    k, err, sizeof err);
  next_paths_clear (&paths);
  if (k->starting == NULL)
    next_started (0, err, k);
}

void
keeper_restart_server (struct keeper *k)
{
  char err[512];

  if (k->spec.in_process) {
    /* Its engine reads the size again, as mloop-server on SIGHUP. */
    if (k->hosted == NULL)
      handover_done (k, "the server is still opening its image");
    else if (hosted_server_reprobe_size (k->hosted, err, sizeof err) == -1)
      handover_done (k, err);
    else {
      say_to (k->log, "serving %" PRIu64 " bytes", 
              hosted_server_size (k->hosted));
      handover_done (k, NULL);
    }
    return;
  }
  if (k->replacing)
    handover_done (k, "a planned restart is under way already; try again "
                   "when it is done");
  else if (server_serving (k)) {
    say_to (k->log, "restart of server pid %d asked for", (int) k->server);
    replace_server_async (k);
  }
  else
    handover_done (k, "the server is being restarted after a failure; "
                   "try again when `mloop status` shows it running");
}

/* --- The keeper's life ------------------------------------------------ */

static int
no_device (void *unused)
{
  return -1;
}

static void
nothing_to_heal (void *unused)
{
}

void
keeper_hold_shared (void)
{
  static struct dead_slots held;

  kernel_log_hold ();
  dead_slots_listen (&held, no_device, nothing_to_heal, NULL,
                     "connections the kernel drops will not be reconnected",
                     stderr);
}

struct keeper *
keeper_new (const struct keeper_config *config)
{
  struct keeper *k = g_new0 (struct keeper, 1);
  const struct mloop_server_spec *s = &config->server;

  k->pidfd = -1;
  k->backoff_ms = BACKOFF_MIN_MS;
  k->index = -1;
  k->heal_retry_ms = HEAL_RETRY_MIN_MS;
  k->released_lock = -1;
  k->log = config->log;
  k->released = config->released;
  k->released_data = config->data;
  k->dir = g_strdup (config->dir);
  k->image = g_strdup (s->image);
  k->overlay = g_strdup (s->overlay);
  k->socket_path = g_build_filename (k->dir, MLOOP_DIR_SOCKET, NULL);
  k->pid_file = g_build_filename (k->dir, MLOOP_DIR_SERVER_PID, NULL);
  k->log_file = g_build_filename (k->dir, MLOOP_DIR_SERVER_LOG, NULL);
  k->stats_file = g_build_filename (k->dir, MLOOP_DIR_STATS, NULL);
  if (mloop_is_rbd_name (k->image))
    k->lock_record = g_build_filename (k->dir, MLOOP_DIR_RBD_LOCK, NULL);
  k->spec = *s;
  k->spec.image = k->image;
  k->spec.overlay = k->overlay;
  k->spec.socket_path = k->socket_path;
  k->spec.pid_file = k->pid_file;
  k->spec.log_file = k->log_file;
  k->spec.stats_file = k->stats_file;
  k->spec.lock_record = k->lock_record;
  /* Before the device exists, so no announcement about it is missed. */
  kernel_log_hold ();
  dead_slots_listen (&k->slots, device_index, heal_soon, k,
                     "connections the kernel drops will not be reconnected",
                     k->log);
  return k;
}

/* The watches of a keeper whose server serves. */
static void
begin_keeping (struct keeper *k)
{
  if (!k->spec.in_process && k->witness == NULL)
    k->witness = overlay_witness_open (k->overlay, k->log);
  release_watch_start (&k->release, k->dir, on_released, k);
  if (mloop_is_rbd_name (k->spec.image))
    k->size_source = g_timeout_add_seconds (SIZE_POLL_S, follow_image_size,
                                            k);
}

int
keeper_start (struct keeper *k, pid_t adopted, char *err, size_t errlen)
{
  if (start_server (k, adopted, err, errlen) == -1)
    return -1;
  say_to (k->log, "server pid %d started for %s", (int) k->server,
          k->spec.image);
  begin_keeping (k);
  return 0;
}

/* keeper_start_async's server listens, or did not start. */
static void
first_started (pid_t pid, const char *start_err, void *data)
{
  struct keeper *k = data;
  keeper_started_fn started = k->started;
  char err[1024];

  k->starting = NULL;
  k->started = NULL;
  k->server = pid;
  if (pid <= 0) {
    if (k->reconnect_started)
      say_to (k->log, "the server did not start: %s", start_err);
    started (k, start_err, k->started_data);
    return;
  }
  if (watch_server (k, err, sizeof err) == -1) {
    mloop_server_stop (pid, k->spec.socket_path, STOP_TIMEOUT_MS);
    k->server = 0;
    started (k, err, k->started_data);
    return;
  }
  say_to (k->log, "server pid %d started for %s", (int) k->server,
          k->spec.image);
  begin_keeping (k);
  if (k->reconnect_started && reconnect_device (k, err, sizeof err) == -1) {
    /* As after a restart: the next try starts the server whole. */
    say_to (k->log, "reconnecting the device to server pid %d failed: %s",
            (int) k->server, err);
    g_free (k->last_failure);
    k->last_failure = g_strdup (err);
    record (k);
    k->backoff_ms = MIN (k->backoff_ms * 2, BACKOFF_MAX_MS);
    kill (k->server, SIGKILL);
  }
  started (k, NULL, k->started_data);
}

/* A hosted server opened (H) or not (ERR): as first_started, and for a
 * device a service before us kept, the kernel handed connections to it.
 */
static void
hosted_opened (struct hosted_server *h, const char *open_err, void *data)
{
  struct keeper *k = data;
  keeper_started_fn started = k->started;
  char err[1024];

  k->hosting = NULL;
  k->started = NULL;
  k->hosted = h;
  if (h == NULL) {
    snprintf (err, sizeof err, "the %s server (inside mloopd) failed to "
              "start: %s", k->spec.kind->name, open_err);
    if (k->reconnect_started)
      say_to (k->log, "%s", err);
    started (k, err, k->started_data);
    return;
  }
  k->started_at = g_get_monotonic_time ();
  say_to (k->log, "serving %s in this process (pid %d)", k->spec.image,
          (int) getpid ());
  record (k);
  begin_keeping (k);
  if (k->reconnect_started && reconnect_device (k, err, sizeof err) == -1) {
    /* The device keeps its dead connections; the heal hands it new ones
     * as for any it dropped.
     */
    say_to (k->log, "reconnecting the device failed: %s; trying again as "
            "for dropped connections", err);
    k->slots.lost = TRUE;
    schedule_heal (k, k->heal_retry_ms);
  }
  started (k, NULL, k->started_data);
}

void
keeper_start_async (struct keeper *k, keeper_started_fn started, void *data)
{
  char err[1024];

  k->started = started;
  k->started_data = data;
  if (k->spec.in_process) {
    /* No pid file names a server inside us: one left would name the
     * last server (hosted_server_open replaces its socket).
     */
    g_unlink (k->spec.pid_file);
    k->hosting = hosted_start_begin (&k->spec, hosted_opened, k);
    return;
  }
  clear_last_server (k);
  k->starting = server_start_begin (&k->spec, 0, START_TIMEOUT_MS,
                                    first_started, k, err, sizeof err);
  if (k->starting == NULL)
    first_started (0, err, k);
}

void
keeper_take_over_new (struct keeper *k, keeper_started_fn started,
                      void *data)
{
  k->reconnect_started = TRUE;
  k->spec.overlay_must_exist = true;
  keeper_start_async (k, started, data);
}

bool
keeper_starting (const struct keeper *k)
{
  return k->started != NULL;
}

/* Kills PID, left behind by a keeper before us, if its command line
 * names MARK (else the pid is another's now), and waits until it is gone
 * (its image's locks and socket with it).  Not our child: its pidfd
 * says when.
 */
static void
kill_left (struct keeper *k, pid_t pid, const char *mark, const char *what)
{
  int pidfd;

  if (pid <= 0 || !mloop_server_running (pid, mark))
    return;
  say_to (k->log, "killing %s pid %d, left behind by the last keeper",
          what, (int) pid);
  pidfd = (int) syscall (SYS_pidfd_open, pid, 0);
  if (pidfd != -1)
    kill_old_server (pid, pidfd);
  else
    kill (pid, SIGKILL);
}

/* What a keeper killed mid-start left (server_start.h): a server
 * spawned that had not listened yet, named by its start's record alone,
 * and a planned restart's next server, started or not, never handed the
 * device.  Each is killed before this keeper watches or starts a server,
 * so the device has one server, the one its pid file names.  SERVER is
 * that one (0 when none runs): a start's record left behind may name it
 * too, when the keeper was killed after it listened.
 */
static void
stop_left_starts (struct keeper *k, pid_t server)
{
  struct next_paths next;
  pid_t left = server_start_left (k->spec.pid_file);
  g_autofree char *next_pid_text = NULL;

  if (left != server)
    kill_left (k, left, k->spec.socket_path, "a server starting");
  server_start_forget (k->spec.pid_file);
  next_paths_init (k, &next);
  kill_left (k, server_start_left (next.pid_file), next.sock,
             "a planned restart's next server starting");
  server_start_forget (next.pid_file);
  if (g_file_get_contents (next.pid_file, &next_pid_text, NULL, NULL))
    kill_left (k, (pid_t) atoi (next_pid_text), next.sock,
               "a planned restart's next server");
  g_unlink (next.sock);
  g_unlink (next.pid_file);
  g_unlink (next.stats);
  next_paths_clear (&next);
}

int
keeper_take_over (struct keeper *k, pid_t server, char *err, size_t errlen)
{
  if (k->spec.in_process) {
    /* What the service before us served in it died with it. */
    stop_left_starts (k, 0);
    snprintf (err, errlen, "%s was served in the last service's process",
              k->dir);
    return -1;
  }
  stop_left_starts (k, mloop_server_running (server, k->spec.socket_path)
                    ? server : 0);
  if (server <= 0 || !mloop_server_running (server, k->spec.socket_path)) {
    snprintf (err, errlen, "no server of %s runs as pid %d", k->dir,
              (int) server);
    return -1;
  }
  k->server = server;
  if (watch_server (k, err, errlen) == -1) {
    k->server = 0;
    return -1;
  }
  say_to (k->log, "server pid %d taken over for %s", (int) k->server,
          k->spec.image);
  begin_keeping (k);
  /* Slots the kernel dropped while no keeper listened were announced to
   * nobody: offered connections as if announcements were lost, until the
   * kernel takes no more (one handshake when none is dead).
   */
  k->slots.lost = TRUE;
  heal_soon (k);
  return 0;
}

int
keeper_connections (struct keeper *k, unsigned n, int *fds,
                    struct mloop_nbd_export *x, char *err, size_t errlen)
{
  if (k->hosted == NULL) {
    snprintf (err, errlen, "%s is not served inside this process",
              k->dir);
    return -1;
  }
  hosted_server_export (k->hosted, &x->size, &x->flags, &x->min_block,
                        &x->preferred_block, &x->max_block);
  return hosted_server_pair (k->hosted, n, fds, err, errlen);
}

bool
keeper_in_process (const struct keeper *k)
{
  return k->spec.in_process;
}

pid_t
keeper_server_pid (const struct keeper *k)
{
  return k->spec.in_process ? (k->hosted ? getpid () : 0) : k->server;
}

static void
remove_source (guint *source)
{
  if (*source != 0)
    g_source_remove (*source);
  *source = 0;
}

/* Stops every source of K and closes what it watches with. */
static void
stop_watching (struct keeper *k)
{
  remove_source (&k->pidfd_source);
  remove_source (&k->restart_source);
  remove_source (&k->heal_source);
  remove_source (&k->size_source);
  release_watch_stop (&k->release);
  if (k->pidfd != -1)
    close (k->pidfd);
  k->pidfd = -1;
  dead_slots_close (&k->slots);
}

static void
keeper_free (struct keeper *k)
{
  overlay_witness_free (k->witness);
  kernel_log_release ();
  g_free (k->last_failure);
  g_free (k->last_reconnect);
  g_free (k->handover_error);
  g_free (k->size_refusal);
  g_free (k->image);
  g_free (k->overlay);
  g_free (k->socket_path);
  g_free (k->pid_file);
  g_free (k->log_file);
  g_free (k->stats_file);
  g_free (k->lock_record);
  g_free (k->dir);
  g_free (k);
}

void
keeper_let_go (struct keeper *k)
{
  say_to (k->log, "letting go of server pid %d, which serves on",
          (int) k->server);
  /* One still starting serves on too, for the next keeper to find; a
   * planned restart's next server does not (the old one serves on, or
   * went first, and the next keeper starts another).
   */
  if (k->starting)
    server_start_abandon (k->starting, !k->replacing);
  if (k->hosting)
    hosted_start_abandon (k->hosting);
  /* A hosted server is left as it is: the process is ending, and its
   * connections end with it as a killed server's do (a drain would
   * answer requests received with ESHUTDOWN, which the kernel fails as
   * IO errors); the next service serves the device anew.
   */
  stop_watching (k);
  if (k->released_lock != -1)
    mloop_state_unlock (k->released_lock);
  keeper_free (k);
}

void
keeper_stop (struct keeper *k)
{
  say_to (k->log, "stopping server pid %d", (int) keeper_server_pid (k));
  /* A server still starting (a restart's, a planned restart's next) is
   * killed now, not when its start ends: mloop-supervisor's loop never
   * runs again, and until then it would hold the overlay's lock.
   */
  if (k->starting)
    server_start_kill (k->starting);
  if (k->hosting)
    hosted_start_abandon (k->hosting);
  stop_watching (k);
  if (k->hosted)
    hosted_server_close (k->hosted);
  if (k->server > 0)
    mloop_server_stop (k->server, k->spec.socket_path, STOP_TIMEOUT_MS);
  if (k->server > 0)
    waitpid (k->server, NULL, WNOHANG);
  /* A server killed at the stop's timeout (a stalled disk) may have
   * taken a failed sync's report with it; this process may end now.
   */
  overlay_witness_check_now (k->witness);
  if (k->released_lock != -1) {
    struct mloop_device_state st;

    /* Detached by its last close: as `mloop detach` would, drop a
     * temporary overlay now that the server is gone.
     */
    if (mloop_state_load (k->dir, &st) == 0) {
      mloop_state_remove_temporary_overlay (&st);
      mloop_state_clear (&st);
    }
    mloop_state_remove (k->dir);
    mloop_state_unlock (k->released_lock);
  }
  keeper_free (k);
}
