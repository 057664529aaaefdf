/* mloop — starting and stopping the server behind an attached device. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <glib.h>

#include "device_state.h"
#include "errmsg.h"
#include "held_image.h"
#include "server_process.h"
#include "side_by_side.h"

#define POLL_INTERVAL_US 20000

/* ENV_NAME if set; else BUILD_RELATIVE next to the running program when
 * it runs from the build tree; else INSTALLED.
 */
char *
mloop_locate_program (const char *env_name, const char *build_relative,
        const char *installed)
{
  const char *env = g_getenv (env_name);
  g_autofree char *exe = NULL;
  g_autofree char *dir = NULL;
  char *candidate;

  /* Made absolute: the programs started here run in / (see
   * detach_session), where a relative path would lead elsewhere.
   */
  if (env && *env)
    return strchr (env, '/') ? g_canonicalize_filename (env, NULL)
      : g_strdup (env);
  exe = g_file_read_link ("/proc/self/exe", NULL);
  if (exe) {
    dir = g_path_get_dirname (exe);
    candidate = g_build_filename (dir, "..", build_relative, NULL);
    if (g_file_test (candidate, G_FILE_TEST_EXISTS))
      return candidate;
    g_free (candidate);
  }
  return g_strdup (installed);
}

/* Runs in the child between fork and exec: leave the caller's session so
 * its terminal's signals (^C, hangup) do not reach the server, and the
 * caller's working directory, which a server living for weeks would
 * keep busy (its file system could not be unmounted).  Every path a
 * server is given is absolute.
 */
static void
detach_session (gpointer unused)
{
  setsid ();
  if (chdir ("/") == -1)
    _exit (127);
}

/* The last non-empty line of the server's log, or NULL. */
static char *
last_log_line (const char *log_file)
{
  g_autofree char *text = NULL;
  g_auto (GStrv) lines = NULL;

  if (!g_file_get_contents (log_file, &text, NULL, NULL))
    return NULL;
  lines = g_strsplit (g_strstrip (text), "\n", -1);
  for (int i = g_strv_length (lines) - 1; i >= 0; i--)
    /* nbdkit follows some errors with "Use 'nbdkit --help' or read the
     * nbdkit(1) manual page...": the error is the line before.
     */
    if (*g_strstrip (lines[i]) && !g_str_has_prefix (lines[i], "Use '"))
      return g_strdup (lines[i]);
  return NULL;
}

/* The pid in a complete pid file, or 0. */
static pid_t
pid_file_read (const char *pid_file)
{
  g_autofree char *text = NULL;
  char *end;
  long pid;

  if (!g_file_get_contents (pid_file, &text, NULL, NULL))
    return 0;
  pid = strtol (text, &end, 10);
  return pid > 1 && *end == '\n' ? (pid_t) pid : 0;
}

int
mloop_process_spawn (char **argv, const char *log_file, const char *what,
                     pid_t *child, char *err, size_t errlen)
{
  g_autoptr (GError) gerr = NULL;
  const int held = mloop_held_image_fd ();
  const int held_target = MLOOP_HELD_IMAGE_FD;
  GPid spawned;
  int log_fd;

  *child = 0;
  log_fd = open (log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd == -1)
    return mloop_fail (err, errlen, "cannot create %s: %s", log_file,
                 strerror (errno));
  /* Nothing else is inherited but a held image (held_image.h). */
  if (!g_spawn_async_with_pipes_and_fds (NULL, (const char *const *) argv,
                                         NULL, G_SPAWN_DO_NOT_REAP_CHILD |
                                         G_SPAWN_SEARCH_PATH,
                                         detach_session, NULL, -1, log_fd,
                                         log_fd, &held, &held_target,
                                         held == -1 ? 0 : 1, &spawned,
                                         NULL, NULL, NULL, &gerr)) {
    close (log_fd);
    return mloop_fail (err, errlen, "cannot start %s (%s): %s", what, argv[0],
                 gerr->message);
  }
  close (log_fd);
  *child = spawned;
  return 0;
}

/* Why the program WHAT ended before it served: its own last words
 * "WHAT: why" when it said them (phrased for the user), else its log's
 * last line.
 */
static int
start_failure (const char *log_file, const char *what, char *err,
               size_t errlen)
{
  g_autofree char *line = last_log_line (log_file);
  g_autofree char *prefix = g_strconcat (what, ": ", NULL);

  if (line && g_str_has_prefix (line, prefix))
    return mloop_fail (err, errlen, "%s", line + strlen (prefix));
  return mloop_fail (err, errlen, "%s failed to start: %s", what,
                     line ? line : "it exited without a message");
}

int
mloop_process_check (pid_t child, const char *log_file, const char *pid_file,
                     const char *what, pid_t *pid, char *err, size_t errlen)
{
  int status;

  if (waitpid (child, &status, WNOHANG) == child)
    return start_failure (log_file, what, err, errlen);
  *pid = pid_file_read (pid_file);
  return *pid != 0;
}

/* Wakes wait_for_change when a file in PID_FILE's directory is written
 * or renamed into place: servers write their pid file once they listen,
 * so the wait ends the moment they do.  -1 without inotify; the wait then
 * looks again every POLL_INTERVAL_US.
 */
static int
watch_dir_of (const char *pid_file)
{
  g_autofree char *dir = g_path_get_dirname (pid_file);
  int fd = inotify_init1 (IN_CLOEXEC | IN_NONBLOCK);

  if (fd != -1 &&
      inotify_add_watch (fd, dir, IN_CLOSE_WRITE | IN_MOVED_TO) == -1) {
    close (fd);
    fd = -1;
  }
  return fd;
}

/* Sleeps until WATCH (watch_dir_of) or the child's PIDFD says something
 * changed, or MS milliseconds pass.  Either may be -1.
 */
static void
wait_for_change (int watch, int pidfd, int ms)
{
  struct pollfd p[2] = {
    { .fd = watch, .events = POLLIN }, { .fd = pidfd, .events = POLLIN },
  };
  char events[4096];

  if (watch == -1)
    ms = MIN (ms, POLL_INTERVAL_US / 1000);
  if (poll (p, 2, ms) > 0 && (p[0].revents & POLLIN))
    while (read (watch, events, sizeof events) > 0)
      ;
}

/* Waits up to TIMEOUT_MS for PID_FILE to name a process, while *CHILD
 * (started to write it, or to have it written) lives.  WHAT names the
 * program in errors, LOG_FILE holds its words.  When MAY_DAEMONIZE,
 * *CHILD exiting 0 is a daemon's fork, not a failure.  *CHILD becomes 0
 * once it has ended, so a failure with *CHILD still set is a timeout and
 * the caller's to end; *PID is the pid in the file.
 */
static int
await_pid_file (pid_t *child, const char *pid_file, bool may_daemonize,
                const char *log_file, const char *what, unsigned timeout_ms,
                pid_t *pid, char *err, size_t errlen)
{
  gint64 deadline = g_get_monotonic_time () + (gint64) timeout_ms * 1000;
  int watch = watch_dir_of (pid_file);
  int pidfd = *child > 0 ? (int) syscall (SYS_pidfd_open, *child, 0) : -1;
  int status, r;

  for (;;) {
    gint64 left;

    if (*child > 0 && waitpid (*child, &status, WNOHANG) == *child) {
      bool daemonized = may_daemonize && WIFEXITED (status) &&
        WEXITSTATUS (status) == 0;

      *child = 0;
      if (pidfd != -1)
        close (pidfd);
      pidfd = -1;
      if (!daemonized) {
        r = start_failure (log_file, what, err, errlen);
        break;
      }
    }
    if ((*pid = pid_file_read (pid_file)) != 0) {
      r = 0;
      break;
    }
    left = deadline - g_get_monotonic_time ();
    if (left <= 0) {
      r = mloop_fail (err, errlen, "%s did not start listening within %u s",
                      what, timeout_ms / 1000);
      break;
    }
    wait_for_change (watch, pidfd, (int) ((left + 999) / 1000));
  }
  if (watch != -1)
    close (watch);
  if (pidfd != -1)
    close (pidfd);
  return r;
}

/* Ends *CHILD, still starting at a timeout, and reaps it. */
static void
kill_child (pid_t *child)
{
  if (*child > 0) {
    kill (*child, SIGKILL);
    waitpid (*child, NULL, 0);
    *child = 0;
  }
}

/* How long a child killed at a start's timeout is waited for, to reap
 * it, ms.
 */
#define KILLED_WAIT_MS 1000

/* Kills CHILD, a process of ours started in vain (reaped already, when
 * it is the supervisor mloop_server_stop stopped), by PIDFD, its pidfd
 * opened before it could be reaped, so never another process by its
 * pid; without one (a kernel before 5.3), by its pid if it is still an
 * unreaped child of ours.  Reaps it if it ends within KILLED_WAIT_MS.
 * One waiting uninterruptibly in a close of a descriptor it inherited
 * (a FUSE file's FLUSH) dies the moment that close ends, before it
 * execs anything, and is left for whoever reaps this process's children
 * (mloop-dbus's reaper; a command's exit hands it to init).
 */
static void
kill_own_child (pid_t child, int pidfd)
{
  siginfo_t info = { 0 };
  int status;

  if (pidfd != -1) {
    struct pollfd p = { .fd = pidfd, .events = POLLIN };

    if (syscall (SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0) == -1)
      return;                   /* gone, and reaped */
    while (poll (&p, 1, KILLED_WAIT_MS) == -1 && errno == EINTR)
      ;
    waitpid (child, &status, WNOHANG);
    return;
  }
  /* Still our child, not reaped (WNOWAIT: only looked at)? */
  if (waitid (P_PID, (id_t) child, &info, WEXITED | WNOHANG | WNOWAIT) == -1)
    return;
  if (info.si_pid == 0)
    kill (child, SIGKILL);
  for (unsigned waited = 0; waited < KILLED_WAIT_MS;
       waited += POLL_INTERVAL_US / 1000) {
    if (waitpid (child, &status, WNOHANG) != 0)
      return;
    g_usleep (POLL_INTERVAL_US);
  }
}

/* Spawns ARGV detached with its output in LOG_FILE and waits up to
 * TIMEOUT_MS for PID_FILE to name a process (await_pid_file).  *CHILD is
 * the spawned pid (0 once it ended), *PID the one in the pid file.
 */
static int
spawn_and_wait (char **argv, const char *log_file, const char *pid_file,
                bool may_daemonize, const char *what, unsigned timeout_ms,
                pid_t *child, pid_t *pid, char *err, size_t errlen)
{
  if (mloop_process_spawn (argv, log_file, what, child, err, errlen) == -1)
    return -1;
  if (await_pid_file (child, pid_file, may_daemonize, log_file, what,
                      timeout_ms, pid, err, errlen) == 0)
    return 0;
  kill_child (child);
  return -1;
}

void
mloop_add_image_args (GPtrArray *argv, uint64_t offset, uint64_t sizelimit,
                      const char *overlay)
{
  if (overlay)
    g_ptr_array_add (argv, g_strdup_printf ("--overlay=%s", overlay));
  if (offset)
    g_ptr_array_add (argv, g_strdup_printf ("--offset=%" G_GUINT64_FORMAT,
                                            offset));
  if (sizelimit)
    g_ptr_array_add (argv, g_strdup_printf ("--sizelimit=%" G_GUINT64_FORMAT,
                                            sizelimit));
}

int
mloop_process_start (char **argv, const char *log_file, const char *pid_file,
                     const char *what, unsigned timeout_ms, pid_t *child,
                     pid_t *pid, char *err, size_t errlen)
{
  pid_t spawned = 0;
  int r = spawn_and_wait (argv, log_file, pid_file, false, what, timeout_ms,
                          &spawned, pid, err, errlen);

  if (child)
    *child = r == 0 ? spawned : 0;
  return r;
}

/* The command line of SPEC's server, listening on its socket for the
 * kernel's client.
 */
static char **
server_argv (const struct mloop_server_spec *spec)
{
  const struct mloop_nbd_address listen = { .unix_path = spec->socket_path };
  const struct mloop_server_config c = {
    .image = spec->image, .offset = spec->offset,
    .sizelimit = spec->sizelimit, .overlay = spec->overlay,
    .overlay_must_exist = spec->overlay_must_exist,
    .lock_record = spec->lock_record, .io_timeout = spec->io_timeout,
    .listen = &listen,
    .pid_file = spec->pid_file,
    .stats_file = spec->stats_file, .threads = spec->threads,
    .read_only = spec->read_only, .kernel_client = true,
  };

  return mloop_server_command (spec->kind, &c);
}

static char *
server_name (const struct mloop_server_spec *spec)
{
  return g_strdup_printf ("the %s server", spec->kind->name);
}

int
mloop_process_await (pid_t child, const char *pid_file, bool may_daemonize,
                     const char *log_file, const char *what,
                     unsigned timeout_ms, pid_t *pid, char *err,
                     size_t errlen)
{
  if (await_pid_file (&child, pid_file, may_daemonize, log_file, what,
                      timeout_ms, pid, err, errlen) == 0)
    return 0;
  kill_child (&child);
  return -1;
}

int
mloop_server_await (const struct mloop_server_spec *spec, pid_t child,
                    unsigned timeout_ms, pid_t *pid, char *err, size_t errlen)
{
  g_autofree char *what = server_name (spec);

  return mloop_process_await (child, spec->pid_file, spec->kind->daemonizes,
                              spec->log_file, what, timeout_ms, pid, err,
                              errlen);
}

int
mloop_server_spawn (const struct mloop_server_spec *spec, pid_t *child,
                    char *err, size_t errlen)
{
  g_auto (GStrv) argv = server_argv (spec);
  g_autofree char *what = server_name (spec);

  /* Each start's messages follow the last one's in the log. */
  return mloop_process_spawn (argv, spec->log_file, what, child, err, errlen);
}

int
mloop_server_start (const struct mloop_server_spec *spec,
                    unsigned timeout_ms, pid_t *pid,
                    char *err, size_t errlen)
{
  pid_t child;

  if (mloop_server_spawn (spec, &child, err, errlen) == -1)
    return -1;
  return mloop_server_await (spec, child, timeout_ms, pid, err, errlen);
}

/* The supervisor's own last words are the server's error, already
 * phrased for the user: passes them on without our wrapping.
 */
static void
supervisor_failure (const char *log_file, char *err, size_t errlen)
{
  g_autofree char *line = last_log_line (log_file);

  if (line && g_str_has_prefix (line, "mloop-supervisor: "))
    mloop_fail (err, errlen, "%s", line + strlen ("mloop-supervisor: "));
}

int
mloop_supervised_start (GPtrArray *supervisor_argv, char **server_argv,
                        const char *server_log, const char *server_pid_file,
                        const char *dir, unsigned timeout_ms,
                        pid_t *supervisor, pid_t *server,
                        char *err, size_t errlen)
{
  g_autofree char *log_file = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_LOG,
                                                NULL);
  g_autofree char *pid_file = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_PID,
                                                NULL);
  pid_t ignored, child;
  int pidfd, r;

  *server = 0;
  if (mloop_spawn_side_by_side (supervisor_argv, log_file, server_argv,
                                server_log, supervisor, err, errlen) == -1)
    return -1;
  /* Ours and not reaped: the pidfd is of this process and no other. */
  child = *supervisor;
  pidfd = (int) syscall (SYS_pidfd_open, child, 0);
  /* Serving once the server is ready and the supervisor, listening for
   * the kernel's announcements before the device exists, has written
   * its pid file.
   */
  r = await_pid_file (supervisor, server_pid_file, false, log_file,
                      "the supervisor", timeout_ms, server, err, errlen);
  if (r == 0)
    r = await_pid_file (supervisor, pid_file, false, log_file,
                        "the supervisor", timeout_ms, &ignored, err, errlen);
  if (r == -1 && *supervisor == 0)
    supervisor_failure (log_file, err, errlen);
  if (r == -1 && *supervisor > 0) {
    /* A timeout: asked to stop, the supervisor stops its server too. */
    mloop_server_stop (*supervisor, dir, timeout_ms);
    /* A child that did not become the supervisor (still closing what it
     * inherited, side_by_side.c) has no command line of its own to be
     * known by there, but it is ours.
     */
    kill_own_child (child, pidfd);
    *supervisor = 0;
  }
  if (pidfd != -1)
    close (pidfd);
  return r;
}

int
mloop_supervisor_start (const struct mloop_server_spec *spec,
                        const char *dir, unsigned timeout_ms,
                        pid_t *supervisor, pid_t *server,
                        char *err, size_t errlen)
{
  g_autoptr (GPtrArray) argv = g_ptr_array_new_with_free_func (g_free);
  g_auto (GStrv) srv_argv = server_argv (spec);

  g_ptr_array_add (argv, mloop_locate_program ("MLOOP_SUPERVISOR_BIN",
                                 "supervisor/mloop-supervisor",
                                 MLOOP_SBINDIR "/mloop-supervisor"));
  g_ptr_array_add (argv, g_strdup_printf ("--dir=%s", dir));
  g_ptr_array_add (argv, g_strdup_printf ("--server=%s", spec->kind->name));
  if (spec->threads)
    g_ptr_array_add (argv, g_strdup_printf ("--threads=%u", spec->threads));
  if (spec->read_only)
    g_ptr_array_add (argv, g_strdup ("--read-only"));
  if (spec->io_timeout)
    g_ptr_array_add (argv, g_strdup_printf ("--io-timeout=%u",
                                            spec->io_timeout));
  /* Every restart serves the same window and overlay. */
  mloop_add_image_args (argv, spec->offset, spec->sizelimit, spec->overlay);
  g_ptr_array_add (argv, g_strdup ("--"));
  g_ptr_array_add (argv, g_strdup (spec->image));
  g_ptr_array_add (argv, NULL);
  return mloop_supervised_start (argv, srv_argv, spec->log_file,
                                 spec->pid_file, dir, timeout_ms, supervisor,
                                 server, err, errlen);
}

int
mloop_supervisor_start_remote (const char *uri, const char *dir,
                               unsigned timeout_ms, pid_t *supervisor,
                               char *err, size_t errlen)
{
  g_autofree char *log_file = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_LOG,
                                                NULL);
  g_autofree char *pid_file = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_PID,
                                                NULL);
  char *argv[] = {
    mloop_locate_program ("MLOOP_SUPERVISOR_BIN",
                          "supervisor/mloop-supervisor",
                          MLOOP_SBINDIR "/mloop-supervisor"),
    g_strdup_printf ("--dir=%s", dir), g_strdup_printf ("--remote=%s", uri),
    NULL,
  };
  pid_t child;
  int r;

  r = spawn_and_wait (argv, log_file, pid_file, false, "the supervisor",
                      timeout_ms, &child, supervisor, err, errlen);
  if (r == -1 && child == 0)
    supervisor_failure (log_file, err, errlen);
  for (char **a = argv; *a; a++)
    g_free (*a);
  return r;
}

/* Zombies count as gone: they no longer hold the image or the socket. */
static bool
process_alive (pid_t pid)
{
  g_autofree char *path = g_strdup_printf ("/proc/%d/stat", (int) pid);
  g_autofree char *stat = NULL;
  const char *state;

  if (!g_file_get_contents (path, &stat, NULL, NULL))
    return false;
  state = strrchr (stat, ')');
  return state && state[1] == ' ' && state[2] != 'Z' && state[2] != 'X';
}

bool
mloop_server_running (pid_t pid, const char *socket_path)
{
  g_autofree char *path = g_strdup_printf ("/proc/%d/cmdline", (int) pid);
  g_autofree char *cmdline = NULL;
  gsize len;

  if (pid <= 1 || !g_file_get_contents (path, &cmdline, &len, NULL))
    return false;
  /* The arguments are NUL-separated; make them one searchable string. */
  for (gsize i = 0; i < len; i++)
    if (cmdline[i] == '\0')
      cmdline[i] = ' ';
  return strstr (cmdline, socket_path) != NULL && process_alive (pid);
}

/* Waits up to TIMEOUT_MS for PID to end.  Its pidfd wakes us the moment
 * it does (it need not be our child); without one (a kernel before
 * 5.3), polls.  Returns whether it ended.
 */
static bool
wait_gone (pid_t pid, unsigned timeout_ms)
{
  int pidfd = (int) syscall (SYS_pidfd_open, pid, 0);
  int status;

  if (pidfd != -1) {
    struct pollfd p = { .fd = pidfd, .events = POLLIN };
    gint64 deadline = g_get_monotonic_time () + (gint64) timeout_ms * 1000;
    gint64 left;

    while ((left = deadline - g_get_monotonic_time ()) > 0 &&
           poll (&p, 1, (int) ((left + 999) / 1000)) == -1 && errno == EINTR)
      ;
    close (pidfd);
    waitpid (pid, &status, WNOHANG);    /* reaps it if it is our child */
    return !process_alive (pid);
  }
  for (unsigned waited = 0; ; waited += POLL_INTERVAL_US / 1000) {
    /* Reaps it if we are its parent; harmless otherwise. */
    waitpid (pid, &status, WNOHANG);
    if (!process_alive (pid))
      return true;
    if (waited >= timeout_ms)
      return false;
    g_usleep (POLL_INTERVAL_US);
  }
}

void
mloop_server_stop (pid_t pid, const char *socket_path, unsigned timeout_ms)
{
  int status;

  if (!mloop_server_running (pid, socket_path))
    return;
  kill (pid, SIGTERM);
  if (wait_gone (pid, timeout_ms))
    return;
  kill (pid, SIGKILL);
  while (process_alive (pid)) {
    waitpid (pid, &status, WNOHANG);
    g_usleep (POLL_INTERVAL_US);
  }
}
