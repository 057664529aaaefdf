/* mloop-supervisor — keeps the server of one attached device alive.
 *
 * `mloop attach` starts one per device with the device's first server
 * beside it as its child (--adopt, device/side_by_side.c); the
 * supervisor watches that server and, whenever it dies, starts a new one
 * with backoff and hands the kernel fresh connections to it
 * (NBD_CMD_RECONFIGURE).  The device is attached with a dead-connection
 * timeout, so while the server is down the kernel holds IO instead of
 * failing it; requests that were in flight on the dead connections are
 * requeued by the kernel when their request timeout expires.
 *
 * It also heals connections the kernel dropped while the server lives:
 * when a request outlives the request timeout (a slow disk under the
 * image), the kernel shuts that connection down and marks its slot dead,
 * and after a few such timeouts every slot would be dead and all IO would
 * fail.  The kernel announces each dead slot (NBD_CMD_LINK_DEAD,
 * nbd_events.h); the supervisor answers with one new negotiated
 * connection per announcement, each a reconfigure of its own, which the
 * kernel puts in a dead slot.  A server that died is the restart's
 * business instead, which hands the kernel a whole new set.
 *
 * SIGUSR1 asks for a planned restart: `mloop resize` of a device served
 * by nbdkit, which keeps the export size each connection negotiated.
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
 * For an RBD image it also follows resizes made elsewhere (`rbd
 * resize`): every SIZE_POLL_S it asks the server's socket for the size,
 * which the server learns from librbd, and gives a new one to the
 * kernel as `mloop resize` would (resize.h, mloop_resize_follow).
 *
 * It is a child subreaper, so a daemonizing nbdkit's daemon becomes its
 * child and its exit status can be reaped.  A glib main loop waits on the
 * server's pidfd, the kernel's announcements, the restart and reconnect
 * timers and SIGTERM/SIGINT.  It logs to stderr (the device directory's
 * supervisor.log) and records restarts and reconnects in the directory's
 * "supervisor" file for `mloop status`.
 *
 *   mloop-supervisor --dir DIR --server native|nbdkit [--threads N]
 *                    [--read-only] IMAGE
 *
 * A device on a remote export has one too, in a mode of its own that
 * only heals connections (remote.h):
 *
 *   mloop-supervisor --dir DIR --remote nbd://HOST[:PORT]/NAME
 *
 * And one served through ublk by mloop-ublk, in a third mode (ublk.h):
 *
 *   mloop-supervisor --dir DIR --ublk [--queues N] [--block-size N]
 *                    [--id N] IMAGE
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "held_image.h"
#include "device_state.h"
#include "nbd_connect.h"
#include "dead_slots.h"
#include "nbd_netlink.h"
#include "nbd_receivers.h"
#include "release_watch.h"
#include "remote.h"
#include "resize.h"
#include "say.h"
#include "server_process.h"
#include "store_name.h"
#include "ublk.h"

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
/* Kernel log lines older than this are not about the drop at hand. */
#define KMSG_WINDOW_US (120 * G_USEC_PER_SEC)

static struct {
  struct mloop_server_spec spec;
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
  int kmsg;                     /* /dev/kmsg, read for the kernel's reason */
  const char *kernel_reason;    /* the last reason it gave, and when */
  gint64 kernel_reason_at;
  GMainLoop *loop;
  int released_lock;            /* autoclear: the kernel let the device go */
  char *size_refusal;           /* why the device did not follow, once said */
} sv = { .released_lock = -1, .pidfd = -1, .backoff_ms = BACKOFF_MIN_MS, .index = -1,
         .heal_retry_ms = HEAL_RETRY_MIN_MS, .kmsg = -1 };

static void
record (void)
{
  struct mloop_supervisor_record r = {
    .server_pid = sv.server, .restarts = sv.restarts,
    .last_failure = sv.last_failure, .reconnects = sv.reconnects,
    .last_reconnect = sv.last_reconnect, .handovers = sv.handovers,
    .handover_error = sv.handover_error,
  };
  char err[512];

  if (mloop_state_save_supervisor (sv.dir, &r, err, sizeof err) == -1)
    say ("%s", err);
}

static gboolean on_server_exit (gint fd, GIOCondition c, gpointer unused);

/* Watches sv.server: its pidfd wakes on_server_exit.  0, or -1 with ERR. */
static int
watch_server (char *err, size_t errlen)
{
  sv.pidfd = (int) syscall (SYS_pidfd_open, sv.server, 0);
  if (sv.pidfd == -1) {
    snprintf (err, errlen, "pidfd_open: %s", strerror (errno));
    return -1;
  }
  sv.pidfd_source = g_unix_fd_add (sv.pidfd, G_IO_IN, on_server_exit, NULL);
  sv.started_at = g_get_monotonic_time ();
  record ();
  return 0;
}

/* Starts a server and watches it; ADOPTED, when not 0, is the first
 * one, started beside us as our child (mloop_supervisor_start): then
 * only waits for it to listen.  0, or -1 with ERR.
 */
static int
start_server (pid_t adopted, char *err, size_t errlen)
{
  int r;

  if (adopted > 0)
    r = mloop_server_await (&sv.spec, adopted, START_TIMEOUT_MS, &sv.server,
                            err, errlen);
  else {
    /* A killed server leaves its pid file and socket behind: the pid
     * file would look like the new server's, and the socket path must
     * be free.
     */
    g_unlink (sv.spec.pid_file);
    g_unlink (sv.spec.socket_path);
    r = mloop_server_start (&sv.spec, START_TIMEOUT_MS, &sv.server,
                            err, errlen);
  }
  if (r == -1)
    return -1;
  if (watch_server (err, errlen) == -1) {
    mloop_server_stop (sv.server, sv.spec.socket_path, STOP_TIMEOUT_MS);
    return -1;
  }
  return 0;
}

/* Hands the kernel fresh connections to the new server.  Before the
 * device's state exists, `mloop attach` is still connecting it itself.
 */
static int
reconnect_device (char *err, size_t errlen)
{
  struct mloop_device_state st;
  struct mloop_nbd_export x;
  int fds[16];
  unsigned n;
  int r;

  if (mloop_state_load (sv.dir, &st) == -1)
    return 0;
  n = st.connections > 0 && st.connections <= 16 ? st.connections : 1;
  if (mloop_nbd_connect_unix (sv.spec.socket_path, n, fds, &x,
                              err, errlen) == -1) {
    mloop_state_clear (&st);
    return -1;
  }
  r = mloop_nbd_netlink_reconfigure (st.index, st.file, fds, n,
                                     st.dead_timeout,
                                     err, errlen);
  mloop_nbd_close_all (fds, n);
  if (r == 0)
    say ("server pid %d serves /dev/nbd%d again over %u connections",
         (int) sv.server, st.index, n);
  mloop_state_clear (&st);
  return r < 0 ? -1 : 0;
}

static gboolean
restart (gpointer unused)
{
  char err[512];

  if (start_server (0, err, sizeof err) == 0 &&
      reconnect_device (err, sizeof err) == 0) {
    /* The new set filled every dead slot: what was announced is done. */
    sv.restarting = FALSE;
    dead_slots_forget (&sv.slots);
    sv.heal_retry_ms = HEAL_RETRY_MIN_MS;
    if (sv.heal_source != 0) {
      g_source_remove (sv.heal_source);
      sv.heal_source = 0;
    }
    return G_SOURCE_REMOVE;
  }
  say ("restart failed: %s", err);
  g_free (sv.last_failure);
  sv.last_failure = g_strdup (err);
  record ();
  if (sv.server > 0 && sv.pidfd != -1)
    /* It started but the device could not reach it: try again whole. */
    kill (sv.server, SIGKILL);
  else
    g_timeout_add (sv.backoff_ms, restart, NULL);
  sv.backoff_ms = MIN (sv.backoff_ms * 2, BACKOFF_MAX_MS);
  return G_SOURCE_REMOVE;
}

static gboolean
on_server_exit (gint fd, GIOCondition c, gpointer unused)
{
  g_autofree char *how = NULL;
  int status = 0;

  /* Ours to reap: our child, or adopted as subreaper. */
  if (waitpid (sv.server, &status, WNOHANG) != sv.server)
    status = 0;
  close (sv.pidfd);
  sv.pidfd = -1;
  sv.pidfd_source = 0;
  how = describe_exit (status);
  g_free (sv.last_failure);
  sv.last_failure = g_strdup_printf ("server pid %d %s", (int) sv.server,
                                     how);
  if (g_get_monotonic_time () - sv.started_at > HEALTHY_US)
    sv.backoff_ms = BACKOFF_MIN_MS;
  sv.server = 0;
  sv.restarting = TRUE;
  sv.restarts++;
  say ("%s; restart %u in %u ms", sv.last_failure, sv.restarts,
       sv.backoff_ms);
  record ();
  g_timeout_add (sv.backoff_ms, restart, NULL);
  return G_SOURCE_REMOVE;
}

/* --- Connections the kernel dropped while the server lives ------------ */

/* The device's index, once `mloop attach` has written its state. */
static int
device_index (void)
{
  struct mloop_device_state st;

  if (sv.index < 0 && mloop_state_load (sv.dir, &st) == 0) {
    sv.index = st.index;
    mloop_state_clear (&st);
  }
  return sv.index;
}

/* Whether the server serves, with no restart under way: its pidfd is not
 * readable yet (a death the main loop has not seen is still a death).
 */
static bool
server_serving (void)
{
  struct pollfd p = { .fd = sv.pidfd, .events = POLLIN };

  return sv.server > 0 && sv.pidfd != -1 && !sv.restarting &&
    poll (&p, 1, 0) == 0;
}

/* Starts reading the kernel log from its end, for kernel_reason. */
static void
kmsg_open (void)
{
  sv.kmsg = open ("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (sv.kmsg != -1)
    lseek (sv.kmsg, 0, SEEK_END);
}

/* Why the kernel dropped a connection of /dev/nbdINDEX, from the lines
 * its nbd client logged since the last look (drivers/block/nbd.c): a
 * request outlived the request timeout ("Connection timed out,
 * retrying"), a send failed ("Send control failed", "Send data failed",
 * "Request send failed"), or a receive did ("Receive control failed",
 * which also follows a timeout, whose shutdown ends the receive).  The
 * most telling wins; *LINE gets the kernel's words.  The kernel
 * rate-limits these lines (10 per 5 s), so when it said nothing new the
 * reason it gave within the last STICKY_US stands.  NULL when it said
 * none of these or the log is closed.
 */
static const char *
kernel_reason (int index, gint64 sticky_us, char **line)
{
  static const struct { const char *says, *reason; } causes[] = {
    { "Connection timed out", "request timeout" },
    { "Send control failed", "send failed" },
    { "Send data failed", "send failed" },
    { "Request send failed", "send failed" },
    { "Receive control failed", "receive failed" },
  };
  char rec[8192], dev[32];
  size_t best = G_N_ELEMENTS (causes);
  gint64 oldest = g_get_monotonic_time () - KMSG_WINDOW_US;
  ssize_t n;

  *line = NULL;
  snprintf (dev, sizeof dev, "nbd%d: ", index);
  /* One record per read: "PRIO,SEQ,USEC,FLAGS;TEXT\n" and continuation
   * lines; EPIPE says records were overwritten, and reading goes on.
   */
  while (sv.kmsg != -1 &&
         ((n = read (sv.kmsg, rec, sizeof rec - 1)) > 0 ||
          (n == -1 && (errno == EPIPE || errno == EINTR)))) {
    char *text, *at;
    unsigned long long usec;

    if (n <= 0)
      continue;
    rec[n] = '\0';
    text = strchr (rec, ';');
    if (text == NULL || sscanf (rec, "%*u,%*u,%llu", &usec) != 1 ||
        (gint64) usec < oldest)
      continue;
    text[strcspn (text, "\n")] = '\0';
    at = strstr (text, dev);
    if (at == NULL)
      continue;
    at += strlen (dev);
    for (size_t i = 0; i < G_N_ELEMENTS (causes); i++)
      if (g_str_has_prefix (at, causes[i].says)) {
        if (i <= best) {        /* the latest of the most telling */
          best = i;
          g_free (*line);
          *line = g_strdup (at);
        }
        break;
      }
  }
  if (best < G_N_ELEMENTS (causes)) {
    sv.kernel_reason = causes[best].reason;
    sv.kernel_reason_at = g_get_monotonic_time ();
  }
  else if (sv.kernel_reason == NULL ||
           g_get_monotonic_time () - sv.kernel_reason_at > sticky_us)
    return NULL;
  return sv.kernel_reason;
}

/* One new connection, offered for a dead slot of the device in ST:
 * 1 if the kernel took it, 0 if it had no dead slot, -1 with ERR.
 */
static int
replace_one (const struct mloop_device_state *st, char *err, size_t errlen)
{
  struct mloop_nbd_export x;
  int fd, r;

  if (mloop_nbd_connect_unix (sv.spec.socket_path, 1, &fd, &x,
                              err, errlen) == -1)
    return -1;
  if (x.size != st->size) {
    close (fd);
    snprintf (err, errlen, "the server's export has %llu bytes, the "
              "device %llu", (unsigned long long) x.size,
              (unsigned long long) st->size);
    return -1;
  }
  r = mloop_nbd_netlink_replace_dead (st->index, st->file, fd,
                                      st->dead_timeout,
                                      err, errlen);
  close (fd);
  return r < 0 ? -1 : r;
}

/* Every slot has a reader again?  On Linux 6.1 a receive work can wait
 * for a kworker (docs/design.md, "A request held for the whole
 * timeout"); a connection nobody reads times out and is dropped again,
 * so this is said, not acted on.
 */
static void
check_receivers (const struct mloop_device_state *st, unsigned n)
{
  if (!mloop_nbd_receivers_all_running (st->index, n, RECEIVERS_SETTLE_MS,
                                        RECEIVERS_TIMEOUT_MS))
    say ("/dev/nbd%d: %u of %u connections have a receive work running "
         "after the reconnect; requests on the others will time out and "
         "the kernel will drop them again", st->index,
         mloop_nbd_receivers (st->index), n);
}

static gboolean heal (gpointer unused);

static void
schedule_heal (unsigned ms)
{
  if (sv.heal_source == 0)
    sv.heal_source = g_timeout_add (ms, heal, NULL);
}

/* Answers the announcements: as many new connections as slots were
 * announced dead (all of them when announcements were lost), one
 * reconfigure each, until the kernel has no dead slot left.
 */
static gboolean
heal (gpointer unused)
{
  struct mloop_device_state st;
  g_autofree char *said = NULL;
  const char *reason;
  unsigned n, want, done = 0;
  char err[512];
  int r = 1, lock;

  sv.heal_source = 0;
  /* A server that died: the restart hands the kernel a whole new set. */
  if (!server_serving ()) {
    dead_slots_forget (&sv.slots);
    return G_SOURCE_REMOVE;
  }
  /* An attach, detach or resize of this device is under way: after
   * it.  A detach must not find its device given a new connection after
   * its disconnect (the kernel would take it into a slot the disconnect
   * killed, and clear its "disconnected" mark).
   */
  lock = mloop_state_lock_device (sv.dir, false);
  if (lock == -1 && errno == EWOULDBLOCK) {
    schedule_heal (HEAL_DELAY_MS);
    return G_SOURCE_REMOVE;
  }
  /* No state yet: `mloop attach` is still connecting the device. */
  if (mloop_state_load (sv.dir, &st) == -1) {
    mloop_state_unlock (lock);
    dead_slots_forget (&sv.slots);
    return G_SOURCE_REMOVE;
  }
  n = st.connections > 0 ? st.connections : 1;
  want = dead_slots_wanted (&sv.slots, n);
  /* A request timeout's storm lasts about two timeouts. */
  reason = kernel_reason (st.index, 2 * (gint64) st.timeout * G_USEC_PER_SEC,
                          &said);
  while (done < want && (r = replace_one (&st, err, sizeof err)) == 1) {
    done++;
    sv.reconnects++;
    g_free (sv.last_reconnect);
    sv.last_reconnect = g_strdup_printf ("connection dropped by the kernel "
                                         "(%s)", reason ? reason :
                                         "cause not in the kernel log");
    say ("/dev/nbd%d: %s%s%s%s while server pid %d serves; reconnect %u "
         "gave the kernel a new connection in its place", st.index,
         sv.last_reconnect, said ? " [kernel: \"" : "", said ? said : "",
         said ? "\"]" : "", (int) sv.server, sv.reconnects);
  }
  if (r == 0 && done == 0)
    /* A restart (planned or not) replaced them before this ran. */
    say ("/dev/nbd%d: the %u connection(s) the kernel announced dead had "
         "been replaced already", st.index, want);
  else if (r == 0)
    /* NBD_CMD_RECONFIGURE answered 0 without taking the socket. */
    say ("/dev/nbd%d: the kernel has no dead connection left (it took %u "
         "of %u; the next reconfigure was answered 0 and its socket "
         "dropped)", st.index, done, want);
  if (r == -1) {
    say ("/dev/nbd%d: reconnecting a dropped connection failed: %s; "
         "again in %u ms", st.index, err, sv.heal_retry_ms);
    sv.slots.count = want - done;
    schedule_heal (sv.heal_retry_ms);
    sv.heal_retry_ms = MIN (sv.heal_retry_ms * 2, HEAL_RETRY_MAX_MS);
  } else {
    dead_slots_forget (&sv.slots);
    sv.heal_retry_ms = HEAL_RETRY_MIN_MS;
  }
  mloop_state_unlock (lock);
  if (done > 0) {
    record ();
    check_receivers (&st, n);
  }
  mloop_state_clear (&st);
  return G_SOURCE_REMOVE;
}

static void
heal_soon (void)
{
  schedule_heal (HEAL_DELAY_MS);
}

static void replace_server (void);

/* An nbdkit's part in following a resize (mloop_restart_fn). */
static int
restart_for_size (char *err, size_t errlen)
{
  replace_server ();
  if (sv.handover_error == NULL)
    return 0;
  snprintf (err, errlen, "%s", sv.handover_error);
  return -1;
}

/* An RBD image resized elsewhere: the device follows (resize.h). */
static gboolean
follow_image_size (gpointer unused)
{
  uint64_t from = 0, to = 0;
  char err[512];
  int r;

  if (sv.restarting)
    return G_SOURCE_CONTINUE;
  r = mloop_resize_follow (sv.dir, restart_for_size, &from, &to, err,
                           sizeof err);
  if (r == 1) {
    say ("/dev/nbd%d: the image was resized elsewhere; the device follows, "
         "%" PRIu64 " -> %" PRIu64 " bytes", device_index (), from, to);
    g_clear_pointer (&sv.size_refusal, g_free);
  }
  else if (r == -1 && g_strcmp0 (err, sv.size_refusal) != 0) {
    say ("/dev/nbd%d: the image was resized elsewhere, but the device "
         "keeps its size: %s", device_index (), err);
    g_free (sv.size_refusal);
    sv.size_refusal = g_strdup (err);
  }
  return G_SOURCE_CONTINUE;
}

/* An autoclear device's last user closed it and the kernel disconnected
 * it: stop, and remove the device's directory (under LOCK) on the way out.
 */
static void
on_released (int lock)
{
  say ("/dev/nbd%d was closed by its last user: autoclear", device_index ());
  sv.released_lock = lock;
  g_main_loop_quit (sv.loop);
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
handover_done (const char *error)
{
  sv.handovers++;
  g_free (sv.handover_error);
  sv.handover_error = error ? g_strdup (error) : NULL;
  record ();
}

/* A planned restart (SIGUSR1, see the top): the next server first (but
 * see old_first), on SOCKET.next, then the handover.  The next server's command line names
 * SOCKET.next, which contains SOCKET, so mloop_server_running still
 * knows it by the device's socket path.  If the next server does not
 * start, the old one serves on and `mloop resize` says so.
 */
static void
replace_server (void)
{
  g_autofree char *sock = g_strconcat (sv.spec.socket_path, ".next", NULL);
  g_autofree char *pid_file = g_strconcat (sv.spec.pid_file, ".next", NULL);
  /* Counters of its own: until the old server dies, both count, and a
   * connection the old one counted open when it was killed would never
   * be counted closed (mloop status: 5 of 4 connections open).
   */
  g_autofree char *stats = g_strconcat (sv.spec.stats_file, ".next", NULL);
  g_autofree char *failed = NULL;
  struct mloop_server_spec next = sv.spec;
  pid_t old = sv.server, pid;
  /* An RBD image's exclusive lock has one holder: started first, the
   * next server would break the lock of one still answering requests
   * (librbd blocklists it, failing the writes it has in flight).  So the
   * old one goes first, as in a crash; the next takes its lock over at
   * once (lock_record) while the kernel holds IO.
   */
  const bool old_first = sv.spec.lock_record != NULL;
  char err[512];

  next.socket_path = sock;
  next.pid_file = pid_file;
  next.stats_file = stats;
  g_unlink (sock);
  g_unlink (pid_file);
  g_unlink (stats);
  if (old_first) {
    g_source_remove (sv.pidfd_source);
    kill_old_server (old, sv.pidfd);
    sv.server = 0;
    sv.pidfd = -1;
  }
  if (mloop_server_start (&next, START_TIMEOUT_MS, &pid, err,
                          sizeof err) == -1) {
    if (!old_first) {
      failed = g_strdup_printf ("the next server did not start: %s; server "
                                "pid %d serves on", err, (int) old);
      goto out;
    }
    failed = g_strdup_printf ("the next server did not start: %s; "
                              "restarting it", err);
    sv.restarting = TRUE;
    g_timeout_add (sv.backoff_ms, restart, NULL);
    goto out;
  }
  if (!old_first) {
    g_source_remove (sv.pidfd_source);
    kill_old_server (old, sv.pidfd);
  }
  sv.server = pid;
  if (watch_server (err, sizeof err) == -1) {
    failed = g_strdup (err);
    mloop_server_stop (pid, sock, STOP_TIMEOUT_MS);
    sv.server = 0;
    sv.restarting = TRUE;
    g_timeout_add (sv.backoff_ms, restart, NULL);
    goto out;
  }
  /* From here a failure kills the new server: its death starts the
   * ordinary restart, which begins from scratch.
   */
  if (rename (sock, sv.spec.socket_path) == -1 ||
      rename (pid_file, sv.spec.pid_file) == -1 ||
      rename (stats, sv.spec.stats_file) == -1) {
    failed = g_strdup_printf ("renaming %s: %s", sock, strerror (errno));
    kill (pid, SIGKILL);
    goto out;
  }
  /* The kernel takes new sockets only into slots it has marked dead,
   * which it does as each old connection's receive work fails.
   */
  if (device_index () >= 0)
    mloop_nbd_receivers_wait_gone (device_index (), RECEIVERS_TIMEOUT_MS);
  if (reconnect_device (err, sizeof err) == -1) {
    failed = g_strdup_printf ("reconnecting the device failed: %s", err);
    kill (pid, SIGKILL);
    goto out;
  }
  say ("server pid %d replaced server pid %d (planned restart: the image "
       "was resized)", (int) pid, (int) old);
out:
  if (failed)
    say ("planned restart: %s", failed);
  handover_done (failed);
}

static gboolean
on_restart_signal (gpointer unused)
{
  if (server_serving ()) {
    say ("restart of server pid %d asked for (SIGUSR1)", (int) sv.server);
    replace_server ();
  }
  else
    handover_done ("the server is being restarted after a failure; "
                   "try again when `mloop status` shows it running");
  return G_SOURCE_CONTINUE;
}

static gboolean
on_stop_signal (gpointer unused)
{
  g_main_loop_quit (sv.loop);
  return G_SOURCE_REMOVE;
}

int
main (int argc, char **argv)
{
  g_autofree char *server_kind = NULL, *remote = NULL, *overlay = NULL;
  gint threads = 0, queues = 1, block_size = 0, dead_timeout = 30, id = -1;
  gint adopt = 0, io_timeout = 0;
  gboolean read_only = FALSE, ublk = FALSE;
  gint64 offset = 0, sizelimit = 0;
  GOptionEntry entries[] = {
    { "dir", 'd', 0, G_OPTION_ARG_FILENAME, &sv.dir,
      "The device's directory (required)", "DIR" },
    { "server", 's', 0, G_OPTION_ARG_STRING, &server_kind,
      "native or nbdkit", "KIND" },
    { "threads", 't', 0, G_OPTION_ARG_INT, &threads,
      "Server IO workers", "N" },
    { "read-only", 'r', 0, G_OPTION_ARG_NONE, &read_only,
      "Serve read-only", NULL },
    { "offset", 'o', 0, G_OPTION_ARG_INT64, &offset,
      "Serve the image from this byte on", "BYTES" },
    { "sizelimit", 0, 0, G_OPTION_ARG_INT64, &sizelimit,
      "Serve at most this many bytes", "BYTES" },
    { "overlay", 0, 0, G_OPTION_ARG_FILENAME, &overlay,
      "Write to this copy-on-write overlay", "FILE" },
    { "adopt", 0, 0, G_OPTION_ARG_INT, &adopt,
      "The first server, started as our child: wait for it to listen",
      "PID" },
    { "remote", 0, 0, G_OPTION_ARG_STRING, &remote,
      "No server: reconnect the device to this export (remote.h)",
      "nbd://HOST[:PORT]/NAME" },
    { "ublk", 0, 0, G_OPTION_ARG_NONE, &ublk,
      "Serve IMAGE through ublk with mloop-ublk (ublk.h)", NULL },
    { "queues", 'q', 0, G_OPTION_ARG_INT, &queues,
      "ublk: hardware queues", "N" },
    { "block-size", 'b', 0, G_OPTION_ARG_INT, &block_size,
      "ublk: logical block size", "BYTES" },
    { "id", 'n', 0, G_OPTION_ARG_INT, &id,
      "ublk: add the device as /dev/ublkbN", "N" },
    { "dead-timeout", 0, 0, G_OPTION_ARG_INT, &dead_timeout,
      "ublk: stop the device after this long without a server", "S" },
    { "io-timeout", 0, 0, G_OPTION_ARG_INT, &io_timeout,
      "An RBD image's servers fail requests the cluster has not answered "
      "in this long", "S" },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new ("IMAGE");
  g_autoptr (GError) gerr = NULL;
  g_autofree char *pid_path = NULL;
  char err[512], pid_text[32];

  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr)) {
    fprintf (stderr, "mloop-supervisor: %s\n", gerr->message);
    return EXIT_FAILURE;
  }
  if (offset < 0 || sizelimit < 0 || io_timeout < 0) {
    fprintf (stderr, "mloop-supervisor: --offset, --sizelimit and "
             "--io-timeout must not be negative\n");
    return EXIT_FAILURE;
  }
  if (remote && argc == 1 && sv.dir)
    return mloop_supervise_remote (sv.dir, remote);
  if (ublk) {
    const struct mloop_ublk_spec spec = {
      .image = argv[1], .offset = (uint64_t) offset,
      .sizelimit = (uint64_t) sizelimit, .overlay = overlay,
      .queues = (unsigned) queues,
      .id = id, .block_size = (uint32_t) block_size, .read_only = read_only,
      .io_timeout = (unsigned) io_timeout,
    };

    if (argc != 2 || sv.dir == NULL || queues < 1 || block_size < 0 ||
        dead_timeout < 1 || id < -1) {
      fprintf (stderr, "mloop-supervisor: --ublk needs --dir DIR, one IMAGE, "
               "--queues and --dead-timeout of at least 1\n");
      return EXIT_FAILURE;
    }
    return mloop_supervise_ublk (sv.dir, &spec, (unsigned) dead_timeout,
                                 (pid_t) adopt);
  }
  if (argc != 2 || sv.dir == NULL) {
    fprintf (stderr, "mloop-supervisor: need --dir DIR and one IMAGE, "
             "or --dir DIR and --remote URI\n");
    return EXIT_FAILURE;
  }
  sv.spec.kind = server_kind ? mloop_server_kind_find (server_kind, err,
                                                       sizeof err)
    : mloop_server_kind_default ();
  if (sv.spec.kind == NULL) {
    fprintf (stderr, "mloop-supervisor: --server %s\n", err);
    return EXIT_FAILURE;
  }
  sv.spec.image = argv[1];
  /* Inherited from attach: every server gets it (held_image.h). */
  if (mloop_is_held_image (sv.spec.image))
    mloop_held_image_set (MLOOP_HELD_IMAGE_FD);
  sv.spec.threads = threads > 0 ? (unsigned) threads : 0;
  sv.spec.read_only = read_only;
  sv.spec.offset = (uint64_t) offset;
  sv.spec.sizelimit = (uint64_t) sizelimit;
  sv.spec.overlay = overlay;
  sv.spec.io_timeout = (unsigned) io_timeout;
  sv.spec.socket_path = g_build_filename (sv.dir, MLOOP_DIR_SOCKET, NULL);
  sv.spec.pid_file = g_build_filename (sv.dir, MLOOP_DIR_SERVER_PID, NULL);
  sv.spec.log_file = g_build_filename (sv.dir, MLOOP_DIR_SERVER_LOG, NULL);
  sv.spec.stats_file = g_build_filename (sv.dir, MLOOP_DIR_STATS, NULL);
  if (mloop_is_rbd_name (sv.spec.image))
    sv.spec.lock_record = g_build_filename (sv.dir, MLOOP_DIR_RBD_LOCK, NULL);

  /* Orphans (nbdkit's daemon) become our children, so we can reap them. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  sv.loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  g_unix_signal_add (SIGUSR1, on_restart_signal, NULL);
  /* Before the device exists, so no announcement about it is missed. */
  kmsg_open ();
  dead_slots_listen (&sv.slots, device_index, heal_soon,
                     "connections the kernel drops will not be reconnected");
  /* `mloop attach` connects the device once this file exists: we are
   * listening by then.
   */
  pid_path = g_build_filename (sv.dir, MLOOP_DIR_SUPERVISOR_PID, NULL);
  snprintf (pid_text, sizeof pid_text, "%d\n", (int) getpid ());
  g_file_set_contents (pid_path, pid_text, -1, NULL);
  /* The first start's failure is attach's failure: say it and leave. */
  if (start_server ((pid_t) adopt, err, sizeof err) == -1) {
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    g_unlink (pid_path);
    return EXIT_FAILURE;
  }
  say ("server pid %d started for %s", (int) sv.server, sv.spec.image);
  mloop_release_watch (sv.dir, on_released);
  if (mloop_is_rbd_name (sv.spec.image))
    g_timeout_add_seconds (SIZE_POLL_S, follow_image_size, NULL);
  g_main_loop_run (sv.loop);

  say ("stopping server pid %d", (int) sv.server);
  if (sv.server > 0)
    mloop_server_stop (sv.server, sv.spec.socket_path, STOP_TIMEOUT_MS);
  if (sv.server > 0)
    waitpid (sv.server, NULL, WNOHANG);
  g_unlink (pid_path);
  dead_slots_close (&sv.slots);
  if (sv.kmsg != -1)
    close (sv.kmsg);
  if (sv.released_lock != -1) {
    struct mloop_device_state st;

    /* Detached by its last close: as `mloop detach` would, drop a
     * temporary overlay now that the server is gone.
     */
    if (mloop_state_load (sv.dir, &st) == 0) {
      mloop_state_remove_temporary_overlay (&st);
      mloop_state_clear (&st);
    }
    mloop_state_remove (sv.dir);
    mloop_state_unlock (sv.released_lock);
  }
  return EXIT_SUCCESS;
}
