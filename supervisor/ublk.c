/* mloop-supervisor — the ublk mode (ublk.h). */
#include <errno.h>
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

#include "device_state.h"
#include "overlay_witness.h"
#include "say.h"
#include "server_process.h"
#include "ublk.h"
#include "ublk_device.h"

#define START_TIMEOUT_MS 60000
#define STOP_TIMEOUT_MS 10000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000
/* How often a recovery under way is looked at (its pid file, its exit). */
#define ATTEMPT_POLL_MS 20
/* How long a stop waits for a recovery (ublk_keeper_stop): well within
 * detach's patience with a supervisor (30 s), with the flush and the
 * server's stop after it.
 */
#define STOP_RECOVERY_MS 10000
/* A server that lived this long earns a quick restart again. */
#define HEALTHY_US (30 * G_USEC_PER_SEC)

struct ublk_keeper {
  char *dir;
  struct mloop_ublk_spec spec;
  char *image, *overlay;        /* the strings spec points to, ours */
  char *pid_file, *log_file;
  int index;                    /* /dev/ublkbINDEX, once it exists */
  pid_t server;                 /* 0 while none serves */
  pid_t attempt;                /* a recovery under way, or 0 */
  gint64 attempt_began;
  guint attempt_source;         /* watch_attempt's timer */
  int pidfd;
  gint64 started_at;
  unsigned restarts;
  char *last_failure;
  char *last_try_error;         /* the last failed recovery's, said once */
  unsigned backoff_ms;
  unsigned dead_timeout_s;      /* give up recovering after this long */
  guint give_up_source;         /* its timer, while no server serves */
  guint pidfd_source;           /* watches pidfd for on_server_exit */
  guint recover_source;         /* the next recovery's timer */
  void (*ended) (struct ublk_keeper *uk, void *data);
  void *ended_data;
  FILE *log;
  /* The overlay's witness (overlay_witness.h), checked after each
   * server's exit before a recovery opens it; or NULL.
   */
  struct overlay_witness *witness;
};

/* Records SERVER as the device's server, with the restarts and the
 * last failure.
 */
static void
record_server (struct ublk_keeper *uk, pid_t server)
{
  struct mloop_supervisor_record r = {
    .server_pid = server, .restarts = uk->restarts,
    .last_failure = uk->last_failure,
  };
  char err[512];

  if (mloop_state_save_supervisor (uk->dir, &r, err, sizeof err) == -1)
    say_to (uk->log, "%s", err);
}

static void
record (struct ublk_keeper *uk)
{
  record_server (uk, uk->server);
}

static gboolean on_server_exit (gint fd, GIOCondition c, gpointer data);

/* PID serves the device: watch it die.  0, or -1 with ERR (PID stopped).
 */
static int
serving (struct ublk_keeper *uk, pid_t pid, char *err, size_t errlen)
{
  uk->server = pid;
  uk->pidfd = (int) syscall (SYS_pidfd_open, uk->server, 0);
  if (uk->pidfd == -1) {
    snprintf (err, errlen, "pidfd_open: %s", strerror (errno));
    mloop_server_stop (uk->server, uk->dir, STOP_TIMEOUT_MS);
    uk->server = 0;
    return -1;
  }
  uk->pidfd_source = g_unix_fd_add (uk->pidfd, G_IO_IN, on_server_exit, uk);
  uk->started_at = g_get_monotonic_time ();
  record (uk);
  return 0;
}

/* The first mloop-ublk, which makes the device: attach waits for it
 * anyway.  ADOPTED, when not 0, is one already started as our child
 * (side_by_side.h).  Returns once it serves: 0, or -1 with ERR.
 */
static int
start_server (struct ublk_keeper *uk, pid_t adopted, char *err,
              size_t errlen)
{
  g_auto (GStrv) argv = NULL;
  pid_t pid;
  int r;

  if (adopted > 0)
    r = mloop_process_await (adopted, uk->pid_file, false, uk->log_file,
                             "mloop-ublk", START_TIMEOUT_MS, &pid, err,
                             errlen);
  else {
    argv = mloop_ublk_command (&uk->spec, uk->dir, -1);
    g_unlink (uk->pid_file);
    r = mloop_process_start (argv, uk->log_file, uk->pid_file, "mloop-ublk",
                             START_TIMEOUT_MS, NULL, &pid, err, errlen);
  }
  return r == -1 ? -1 : serving (uk, pid, err, errlen);
}

static gboolean recover (gpointer data);

/* A recovery attempt failed with ERR: try again after the backoff.  The
 * device holds its IO until one takes over, so keep trying (the dead
 * timeout ends that), but say each new reason once, not every try.
 */
static void
recovery_failed (struct ublk_keeper *uk, const char *err)
{
  if (g_strcmp0 (err, uk->last_try_error) != 0) {
    say_to (uk->log, "recovering /dev/ublkb%d failed: %s; trying again every "
            "%u ms at most", uk->index, err, BACKOFF_MAX_MS);
    g_free (uk->last_try_error);
    uk->last_try_error = g_strdup (err);
    g_free (uk->last_failure);
    uk->last_failure = g_strdup_printf ("recovery failed: %s", err);
    record (uk);
  }
  uk->recover_source = g_timeout_add (uk->backoff_ms, recover, uk);
  uk->backoff_ms = MIN (uk->backoff_ms * 2, BACKOFF_MAX_MS);
}

static void
reap (GPid pid, gint status, gpointer unused)
{
  g_spawn_close_pid (pid);
}

/* Ends a recovery attempt still under way (SIGTERM, the dead timeout):
 * SIGKILL, and reaping it is left to GLib, since a process stuck in
 * the kernel (its image's IO hanging) dies only when that returns.
 */
static void
abandon_attempt (struct ublk_keeper *uk)
{
  if (uk->attempt == 0)
    return;
  g_clear_handle_id (&uk->attempt_source, g_source_remove);
  kill (uk->attempt, SIGKILL);
  g_child_watch_add (uk->attempt, reap, NULL);
  uk->attempt = 0;
}

/* Follows the attempt recover() started, without blocking the loop: so
 * SIGTERM (detach) and the dead timeout are served while an attempt
 * waits on the kernel or on its image.
 */
static gboolean
watch_attempt (gpointer data)
{
  struct ublk_keeper *uk = data;
  char err[512];
  pid_t pid = 0;
  int r = mloop_process_check (uk->attempt, uk->log_file, uk->pid_file,
                               "mloop-ublk", &pid, err, sizeof err);

  if (r == 0) {
    if (g_get_monotonic_time () - uk->attempt_began <
        (gint64) START_TIMEOUT_MS * 1000)
      return G_SOURCE_CONTINUE;
    snprintf (err, sizeof err, "mloop-ublk --recover did not serve within "
              "%d s", START_TIMEOUT_MS / 1000);
    uk->attempt_source = 0;      /* this source, ending */
    abandon_attempt (uk);
    recovery_failed (uk, err);
    return G_SOURCE_REMOVE;
  }
  uk->attempt_source = 0;
  uk->attempt = 0;              /* reaped, or serving as uk->server */
  if (r == 1 && serving (uk, pid, err, sizeof err) == 0) {
    say_to (uk->log, "mloop-ublk pid %d serves /dev/ublkb%d again",
            (int) uk->server, uk->index);
    g_clear_pointer (&uk->last_try_error, g_free);
    g_clear_handle_id (&uk->give_up_source, g_source_remove);
    return G_SOURCE_REMOVE;
  }
  recovery_failed (uk, err);
  return G_SOURCE_REMOVE;
}

/* Spawns mloop-ublk --recover for the device (uk->attempt): 0, or -1
 * with ERR.
 */
static int
spawn_attempt (struct ublk_keeper *uk, char *err, size_t errlen)
{
  g_auto (GStrv) argv = mloop_ublk_command (&uk->spec, uk->dir, uk->index);

  /* A killed server's pid file would look like the new one's. */
  g_unlink (uk->pid_file);
  return mloop_process_spawn (argv, uk->log_file, "mloop-ublk", &uk->attempt,
                              err, errlen);
}

/* Starts mloop-ublk --recover for the device; watch_attempt follows it. */
static gboolean
start_attempt (gpointer data)
{
  struct ublk_keeper *uk = data;
  char err[512];

  if (spawn_attempt (uk, err, sizeof err) == -1) {
    recovery_failed (uk, err);
    return G_SOURCE_REMOVE;
  }
  uk->attempt_began = g_get_monotonic_time ();
  uk->attempt_source = g_timeout_add (ATTEMPT_POLL_MS, watch_attempt, uk);
  return G_SOURCE_REMOVE;
}

/* The next recovery attempt, once the overlay's witness has checked
 * what the last process to open it (the server that died, an attempt
 * that died) may have taken with it: the next opener must find the
 * mark.
 */
static gboolean
recover (gpointer data)
{
  struct ublk_keeper *uk = data;

  uk->recover_source = 0;
  /* A check under way starts the attempt when done. */
  if (overlay_witness_busy (uk->witness))
    return G_SOURCE_REMOVE;
  if (!overlay_witness_check (uk->witness, start_attempt, uk))
    start_attempt (uk);
  return G_SOURCE_REMOVE;
}

/* No mloop-ublk took the device over within the dead timeout (its image
 * is gone, say): stop the device, so that its IO fails with EIO instead
 * of waiting for ever, as an NBD device's does past its dead-connection
 * timeout.  In Linux 6.12 stopping takes the disk away; detach then
 * removes what is left.
 */
static gboolean
give_up (gpointer data)
{
  struct ublk_keeper *uk = data;
  char err[512];

  uk->give_up_source = 0;
  abandon_attempt (uk);
  say_to (uk->log, "no mloop-ublk took /dev/ublkb%d over in %u s (%s); "
          "stopping it: its IO fails from now on", uk->index,
          uk->dead_timeout_s,
          uk->last_try_error ? uk->last_try_error : "no try finished");
  if (mloop_ublk_index_reused (uk->dir, uk->index))
    say_to (uk->log, "/dev/ublkb%d is another device of ours now: not "
            "touching it", uk->index);
  else if (mloop_ublk_delete (uk->index, err, sizeof err) == -1)
    say_to (uk->log, "%s", err);
  g_free (uk->last_failure);
  uk->last_failure = g_strdup_printf ("no server for %u s (%s): device "
                                     "stopped", uk->dead_timeout_s,
                                     uk->last_try_error ? uk->last_try_error
                                     : "no try finished");
  record (uk);
  uk->ended (uk, uk->ended_data);
  return G_SOURCE_REMOVE;
}

static gboolean
on_server_exit (gint fd, GIOCondition c, gpointer data)
{
  struct ublk_keeper *uk = data;
  g_autofree char *how = NULL;
  int status = 0;

  if (waitpid (uk->server, &status, WNOHANG) != uk->server)
    status = 0;
  close (uk->pidfd);
  uk->pidfd = -1;
  uk->pidfd_source = 0;
  if (WIFEXITED (status) && WEXITSTATUS (status) == 0) {
    /* Stopped by someone else (its device deleted): nothing to serve. */
    say_to (uk->log, "mloop-ublk pid %d exited: /dev/ublkb%d was stopped from "
            "outside; not restarting", (int) uk->server, uk->index);
    uk->server = 0;
    record (uk);
    uk->ended (uk, uk->ended_data);
    return G_SOURCE_REMOVE;
  }
  how = describe_exit (status);
  g_free (uk->last_failure);
  uk->last_failure = g_strdup_printf ("mloop-ublk pid %d %s", (int) uk->server,
                                     how);
  if (g_get_monotonic_time () - uk->started_at > HEALTHY_US)
    uk->backoff_ms = BACKOFF_MIN_MS;
  uk->server = 0;
  uk->restarts++;
  say_to (uk->log, "%s; recovering /dev/ublkb%d (restart %u) in %u ms",
          uk->last_failure, uk->index, uk->restarts, uk->backoff_ms);
  record (uk);
  uk->recover_source = g_timeout_add (uk->backoff_ms, recover, uk);
  uk->give_up_source = g_timeout_add_seconds (uk->dead_timeout_s, give_up,
                                              uk);
  return G_SOURCE_REMOVE;
}

struct ublk_keeper *
ublk_keeper_new (const char *dir, const struct mloop_ublk_spec *spec,
                 unsigned dead_timeout_s, FILE *log,
                 void (*ended) (struct ublk_keeper *uk, void *data),
                 void *data)
{
  struct ublk_keeper *uk = g_new0 (struct ublk_keeper, 1);

  uk->index = -1;
  uk->pidfd = -1;
  uk->backoff_ms = BACKOFF_MIN_MS;
  uk->log = log;
  uk->ended = ended;
  uk->ended_data = data;
  uk->dir = g_strdup (dir);
  uk->image = g_strdup (spec->image);
  uk->overlay = g_strdup (spec->overlay);
  uk->spec = *spec;
  uk->spec.image = uk->image;
  uk->spec.overlay = uk->overlay;
  uk->dead_timeout_s = dead_timeout_s;
  uk->pid_file = g_build_filename (dir, MLOOP_DIR_SERVER_PID, NULL);
  uk->log_file = g_build_filename (dir, MLOOP_DIR_SERVER_LOG, NULL);
  return uk;
}

int
ublk_keeper_start (struct ublk_keeper *uk, pid_t adopted, char *err,
                   size_t errlen)
{
  if (start_server (uk, adopted, err, errlen) == -1 ||
      mloop_ublk_read_device_file (uk->dir, &uk->index, err, errlen) == -1) {
    if (uk->server > 0) {
      g_clear_handle_id (&uk->pidfd_source, g_source_remove);
      mloop_server_stop (uk->server, uk->dir, STOP_TIMEOUT_MS);
      uk->server = 0;
    }
    return -1;
  }
  say_to (uk->log, "mloop-ublk pid %d serves %s as /dev/ublkb%d",
          (int) uk->server, uk->spec.image, uk->index);
  uk->witness = overlay_witness_open (uk->overlay, uk->log);
  return 0;
}

/* Whether the server has died (its pidfd readable); then it is reaped
 * and forgotten, as on_server_exit would, for a stop that no longer
 * runs the loop.
 */
static bool
server_died (struct ublk_keeper *uk)
{
  struct pollfd p = { .fd = uk->pidfd, .events = POLLIN };

  if (uk->server == 0 || poll (&p, 1, 0) != 1)
    return false;
  say_to (uk->log, "mloop-ublk pid %d died as /dev/ublkb%d was being "
          "stopped", (int) uk->server, uk->index);
  waitpid (uk->server, NULL, WNOHANG);
  g_clear_handle_id (&uk->pidfd_source, g_source_remove);
  close (uk->pidfd);
  uk->pidfd = -1;
  uk->server = 0;
  return true;
}

/* A stop while no server serves (one died; its recovery under way, not
 * begun, or failing): the device holds what the dead server had taken,
 * and its page cache what nobody flushed, and deleting it fails both.
 * One recovery, bounded, lets the stop's flush write them: the attempt
 * under way, or one started now, after the witness's check.  A device
 * already gone (given up, stopped from outside) has nothing to keep.
 */
static void
recover_for_stop (struct ublk_keeper *uk)
{
  gint64 deadline = g_get_monotonic_time () + STOP_RECOVERY_MS * 1000;
  char err[512];
  pid_t pid = 0;
  int r;

  if (uk->server > 0 || uk->index < 0 ||
      !mloop_ublk_device_present (uk->index) ||
      mloop_ublk_index_reused (uk->dir, uk->index))
    return;
  g_clear_handle_id (&uk->attempt_source, g_source_remove);
  if (uk->attempt == 0) {
    overlay_witness_check_now (uk->witness);
    if (spawn_attempt (uk, err, sizeof err) == -1) {
      say_to (uk->log, "recovering /dev/ublkb%d for its stop: %s", uk->index,
              err);
      return;
    }
  }
  /* Named as the server before it serves: detach reads the record once
   * it has stopped us, and should we be killed first (its patience, the
   * OOM killer), it stops this one, which writes the page cache back,
   * rather than delete the device under it.
   */
  record_server (uk, uk->attempt);
  while ((r = mloop_process_check (uk->attempt, uk->log_file, uk->pid_file,
                                   "mloop-ublk", &pid, err,
                                   sizeof err)) == 0 &&
         g_get_monotonic_time () < deadline)
    g_usleep (ATTEMPT_POLL_MS * 1000);
  if (r == 0) {
    say_to (uk->log, "recovering /dev/ublkb%d for its stop: mloop-ublk "
            "--recover did not serve within %d s", uk->index,
            STOP_RECOVERY_MS / 1000);
    return;                     /* abandon_attempt kills it */
  }
  uk->attempt = 0;              /* reaped, or serving */
  if (r == -1 || serving (uk, pid, err, sizeof err) == -1) {
    say_to (uk->log, "recovering /dev/ublkb%d for its stop: %s", uk->index,
            err);
    return;
  }
  g_clear_handle_id (&uk->pidfd_source, g_source_remove);
  say_to (uk->log, "mloop-ublk pid %d serves /dev/ublkb%d again, for its "
          "stop's write-back", (int) uk->server, uk->index);
}

/* A device no server took over for its stop: deleted, which fails the
 * IO it holds (a flush waiting on it among them), so that nothing waits
 * on it for ever once its supervisor is gone.
 */
static void
delete_unserved (struct ublk_keeper *uk)
{
  char err[512];

  abandon_attempt (uk);
  if (uk->index < 0 || !mloop_ublk_device_present (uk->index) ||
      mloop_ublk_index_reused (uk->dir, uk->index))
    return;
  say_to (uk->log, "/dev/ublkb%d: no server to write its page cache back "
          "before the stop: deleting it, what its page cache held is lost",
          uk->index);
  if (mloop_ublk_delete (uk->index, err, sizeof err) == -1)
    say_to (uk->log, "%s", err);
}

/* Writes the device's page cache back before its server is told to
 * stop (mloop_ublk_flush_begin), and what its dead server held: a
 * server that dies during it gets one recovery (the device keeps the
 * writeback for the next server), then the device is deleted, which
 * fails it.
 */
static void
flush_for_stop (struct ublk_keeper *uk)
{
  struct mloop_ublk_flush *f = mloop_ublk_flush_begin (uk->index);
  int r;

  if (!mloop_ublk_flush_wait (f, uk->pidfd)) {
    server_died (uk);
    recover_for_stop (uk);
    if (uk->server == 0 || !mloop_ublk_flush_wait (f, uk->pidfd)) {
      server_died (uk);
      delete_unserved (uk);
    }
  }
  r = mloop_ublk_flush_end (f);
  if (r < 0)
    say_to (uk->log, "/dev/ublkb%d: writing its page cache back before the "
            "stop: %s", uk->index, g_strerror (-r));
}

void
ublk_keeper_stop (struct ublk_keeper *uk)
{
  g_clear_handle_id (&uk->give_up_source, g_source_remove);
  g_clear_handle_id (&uk->recover_source, g_source_remove);
  g_clear_handle_id (&uk->pidfd_source, g_source_remove);
  /* mloop-ublk stops the device and deletes it, once the page cache is
   * written back.  A device without a server is recovered for that, or
   * deleted here.
   */
  server_died (uk);
  recover_for_stop (uk);
  abandon_attempt (uk);         /* one that did not serve in time */
  if (uk->server == 0)
    delete_unserved (uk);
  else if (uk->index >= 0)
    flush_for_stop (uk);
  if (uk->server > 0) {
    say_to (uk->log, "stopping mloop-ublk pid %d", (int) uk->server);
    mloop_server_stop (uk->server, uk->dir, STOP_TIMEOUT_MS);
    waitpid (uk->server, NULL, WNOHANG);
    uk->server = 0;
    /* Killed at the stop's timeout before its STOP_DEV (its own
     * write-back outlasting it), or dead before: the disk is still
     * there, quiesced, holding its IO.
     */
    delete_unserved (uk);
  }
  /* A server killed at the stop's timeout (a stalled disk) may have
   * taken a failed sync's report with it; this process may end now.
   */
  overlay_witness_check_now (uk->witness);
  overlay_witness_free (uk->witness);
  if (uk->pidfd != -1)
    close (uk->pidfd);
  g_free (uk->last_failure);
  g_free (uk->last_try_error);
  g_free (uk->pid_file);
  g_free (uk->log_file);
  g_free (uk->image);
  g_free (uk->overlay);
  g_free (uk->dir);
  g_free (uk);
}
