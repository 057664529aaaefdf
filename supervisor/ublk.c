/* mloop-supervisor — the ublk mode (ublk.h). */
#include <errno.h>
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
#include "say.h"
#include "server_process.h"
#include "ublk.h"

#define START_TIMEOUT_MS 60000
#define STOP_TIMEOUT_MS 10000
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 2000
/* How often a recovery under way is looked at (its pid file, its exit). */
#define ATTEMPT_POLL_MS 20
/* A server that lived this long earns a quick restart again. */
#define HEALTHY_US (30 * G_USEC_PER_SEC)

static struct {
  const char *dir;
  const struct mloop_ublk_spec *spec;
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
  GMainLoop *loop;
} su = { .index = -1, .pidfd = -1, .backoff_ms = BACKOFF_MIN_MS };

static void
record (void)
{
  struct mloop_supervisor_record r = {
    .server_pid = su.server, .restarts = su.restarts,
    .last_failure = su.last_failure,
  };
  char err[512];

  if (mloop_state_save_supervisor (su.dir, &r, err, sizeof err) == -1)
    say ("%s", err);
}

static gboolean on_server_exit (gint fd, GIOCondition c, gpointer unused);

/* PID serves the device: watch it die.  0, or -1 with ERR (PID stopped).
 */
static int
serving (pid_t pid, char *err, size_t errlen)
{
  su.server = pid;
  su.pidfd = (int) syscall (SYS_pidfd_open, su.server, 0);
  if (su.pidfd == -1) {
    snprintf (err, errlen, "pidfd_open: %s", strerror (errno));
    mloop_server_stop (su.server, su.dir, STOP_TIMEOUT_MS);
    su.server = 0;
    return -1;
  }
  g_unix_fd_add (su.pidfd, G_IO_IN, on_server_exit, NULL);
  su.started_at = g_get_monotonic_time ();
  record ();
  return 0;
}

/* The first mloop-ublk, which makes the device: attach waits for it
 * anyway.  ADOPTED, when not 0, is one already started as our child
 * (side_by_side.h).  Returns once it serves: 0, or -1 with ERR.
 */
static int
start_server (pid_t adopted, char *err, size_t errlen)
{
  g_auto (GStrv) argv = NULL;
  pid_t pid;
  int r;

  if (adopted > 0)
    r = mloop_process_await (adopted, su.pid_file, false, su.log_file,
                             "mloop-ublk", START_TIMEOUT_MS, &pid, err,
                             errlen);
  else {
    argv = mloop_ublk_command (su.spec, su.dir, -1);
    g_unlink (su.pid_file);
    r = mloop_process_start (argv, su.log_file, su.pid_file, "mloop-ublk",
                             START_TIMEOUT_MS, NULL, &pid, err, errlen);
  }
  return r == -1 ? -1 : serving (pid, err, errlen);
}

static gboolean recover (gpointer unused);

/* A recovery attempt failed with ERR: try again after the backoff.  The
 * device holds its IO until one takes over, so keep trying (the dead
 * timeout ends that), but say each new reason once, not every try.
 */
static void
recovery_failed (const char *err)
{
  if (g_strcmp0 (err, su.last_try_error) != 0) {
    say ("recovering /dev/ublkb%d failed: %s; trying again every %u ms "
         "at most", su.index, err, BACKOFF_MAX_MS);
    g_free (su.last_try_error);
    su.last_try_error = g_strdup (err);
    g_free (su.last_failure);
    su.last_failure = g_strdup_printf ("recovery failed: %s", err);
    record ();
  }
  g_timeout_add (su.backoff_ms, recover, NULL);
  su.backoff_ms = MIN (su.backoff_ms * 2, BACKOFF_MAX_MS);
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
abandon_attempt (void)
{
  if (su.attempt == 0)
    return;
  g_clear_handle_id (&su.attempt_source, g_source_remove);
  kill (su.attempt, SIGKILL);
  g_child_watch_add (su.attempt, reap, NULL);
  su.attempt = 0;
}

/* Follows the attempt recover() started, without blocking the loop: so
 * SIGTERM (detach) and the dead timeout are served while an attempt
 * waits on the kernel or on its image.
 */
static gboolean
watch_attempt (gpointer unused)
{
  char err[512];
  pid_t pid = 0;
  int r = mloop_process_check (su.attempt, su.log_file, su.pid_file,
                               "mloop-ublk", &pid, err, sizeof err);

  if (r == 0) {
    if (g_get_monotonic_time () - su.attempt_began <
        (gint64) START_TIMEOUT_MS * 1000)
      return G_SOURCE_CONTINUE;
    snprintf (err, sizeof err, "mloop-ublk --recover did not serve within "
              "%d s", START_TIMEOUT_MS / 1000);
    su.attempt_source = 0;      /* this source, ending */
    abandon_attempt ();
    recovery_failed (err);
    return G_SOURCE_REMOVE;
  }
  su.attempt_source = 0;
  su.attempt = 0;               /* reaped, or serving as su.server */
  if (r == 1 && serving (pid, err, sizeof err) == 0) {
    say ("mloop-ublk pid %d serves /dev/ublkb%d again", (int) su.server,
         su.index);
    g_clear_pointer (&su.last_try_error, g_free);
    g_clear_handle_id (&su.give_up_source, g_source_remove);
    return G_SOURCE_REMOVE;
  }
  recovery_failed (err);
  return G_SOURCE_REMOVE;
}

/* Starts mloop-ublk --recover for the device; watch_attempt follows it. */
static gboolean
recover (gpointer unused)
{
  g_auto (GStrv) argv = mloop_ublk_command (su.spec, su.dir, su.index);
  char err[512];

  /* A killed server's pid file would look like the new one's. */
  g_unlink (su.pid_file);
  if (mloop_process_spawn (argv, su.log_file, "mloop-ublk", &su.attempt, err,
                           sizeof err) == -1) {
    recovery_failed (err);
    return G_SOURCE_REMOVE;
  }
  su.attempt_began = g_get_monotonic_time ();
  su.attempt_source = g_timeout_add (ATTEMPT_POLL_MS, watch_attempt, NULL);
  return G_SOURCE_REMOVE;
}

/* No mloop-ublk took the device over within the dead timeout (its image
 * is gone, say): stop the device, so that its IO fails with EIO instead
 * of waiting for ever, as an NBD device's does past its dead-connection
 * timeout.  In Linux 6.12 stopping takes the disk away; detach then
 * removes what is left.
 */
static gboolean
give_up (gpointer unused)
{
  char err[512];

  su.give_up_source = 0;
  abandon_attempt ();
  say ("no mloop-ublk took /dev/ublkb%d over in %u s (%s); stopping it: "
       "its IO fails from now on", su.index, su.dead_timeout_s,
       su.last_try_error ? su.last_try_error : "no try finished");
  if (mloop_ublk_index_reused (su.dir, su.index))
    say ("/dev/ublkb%d is another device of ours now: not touching it",
         su.index);
  else if (mloop_ublk_delete (su.index, err, sizeof err) == -1)
    say ("%s", err);
  g_free (su.last_failure);
  su.last_failure = g_strdup_printf ("no server for %u s (%s): device "
                                     "stopped", su.dead_timeout_s,
                                     su.last_try_error ? su.last_try_error
                                     : "no try finished");
  record ();
  g_main_loop_quit (su.loop);
  return G_SOURCE_REMOVE;
}

static gboolean
on_server_exit (gint fd, GIOCondition c, gpointer unused)
{
  g_autofree char *how = NULL;
  int status = 0;

  if (waitpid (su.server, &status, WNOHANG) != su.server)
    status = 0;
  close (su.pidfd);
  su.pidfd = -1;
  if (WIFEXITED (status) && WEXITSTATUS (status) == 0) {
    /* Stopped by someone else (its device deleted): nothing to serve. */
    say ("mloop-ublk pid %d exited: /dev/ublkb%d was stopped from outside; "
         "not restarting", (int) su.server, su.index);
    su.server = 0;
    record ();
    g_main_loop_quit (su.loop);
    return G_SOURCE_REMOVE;
  }
  how = describe_exit (status);
  g_free (su.last_failure);
  su.last_failure = g_strdup_printf ("mloop-ublk pid %d %s", (int) su.server,
                                     how);
  if (g_get_monotonic_time () - su.started_at > HEALTHY_US)
    su.backoff_ms = BACKOFF_MIN_MS;
  su.server = 0;
  su.restarts++;
  say ("%s; recovering /dev/ublkb%d (restart %u) in %u ms", su.last_failure,
       su.index, su.restarts, su.backoff_ms);
  record ();
  g_timeout_add (su.backoff_ms, recover, NULL);
  su.give_up_source = g_timeout_add_seconds (su.dead_timeout_s, give_up,
                                             NULL);
  return G_SOURCE_REMOVE;
}

static gboolean
on_stop_signal (gpointer unused)
{
  g_main_loop_quit (su.loop);
  return G_SOURCE_REMOVE;
}

int
mloop_supervise_ublk (const char *dir, const struct mloop_ublk_spec *spec,
                      unsigned dead_timeout_s, pid_t adopted)
{
  g_autofree char *pid_path = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_PID,
                                                NULL);
  char err[512], pid_text[32];

  su.dir = dir;
  su.spec = spec;
  su.dead_timeout_s = dead_timeout_s;
  su.pid_file = g_build_filename (dir, MLOOP_DIR_SERVER_PID, NULL);
  su.log_file = g_build_filename (dir, MLOOP_DIR_SERVER_LOG, NULL);
  snprintf (pid_text, sizeof pid_text, "%d\n", (int) getpid ());
  g_file_set_contents (pid_path, pid_text, -1, NULL);

  su.loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  /* The first start's failure is attach's failure: say it and leave. */
  if (start_server (adopted, err, sizeof err) == -1 ||
      mloop_ublk_read_device_file (dir, &su.index, err, sizeof err) == -1) {
    if (su.server > 0)
      mloop_server_stop (su.server, dir, STOP_TIMEOUT_MS);
    fprintf (stderr, "mloop-supervisor: %s\n", err);
    g_unlink (pid_path);
    return EXIT_FAILURE;
  }
  say ("mloop-ublk pid %d serves %s as /dev/ublkb%d", (int) su.server,
       spec->image, su.index);
  g_main_loop_run (su.loop);

  /* SIGTERM: mloop-ublk stops the device and deletes it.  With none
   * running (a recovery under way or still failing, or given up),
   * detach deletes it.
   */
  abandon_attempt ();
  if (su.server > 0) {
    say ("stopping mloop-ublk pid %d", (int) su.server);
    mloop_server_stop (su.server, dir, STOP_TIMEOUT_MS);
    waitpid (su.server, NULL, WNOHANG);
  }
  g_unlink (pid_path);
  return EXIT_SUCCESS;
}
