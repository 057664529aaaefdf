/* A supervisor's start that times out ends the child it forked, even
 * one that never got to exec the supervisor.  A process holding a
 * descriptor of a FUSE file whose server never answers its FLUSH (as
 * mloop-dbus holds its callers' once its closers are full) forks a
 * child that waits, closing its copy, before its exec: no command line
 * of its own, so the stop that knows a supervisor by its command line
 * left it, and it went on to exec the supervisor and its server, for
 * an attach that had failed, the moment the FUSE server answered.  Now
 * the start kills it by its pidfd, it dies as its close ends with
 * nothing forked or exec'd, and it is reaped (here: by its parent).
 *
 * The process that starts is a child of the test named VICTIM, so the
 * test itself never waits on the FUSE server (tests/helpers/
 * fuse-stuck-flush answers everyone else), in a mount namespace of
 * the test's own.  Root: about 2 s (a 1 s start timeout and the start's
 * 1 s wait for its killed child), in the unit suite of every tier; a
 * SKIP without root, /dev/fuse, namespaces or the helper.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include "server_process.h"
#include "unit.h"

#define VICTIM "mloop-victim"
#define START_TIMEOUT_MS 1000

static const char *top;
static char *mnt;
static pid_t fuse_server;

/* The FUSE server gone (every FLUSH waiting on it fails), its mount
 * with it.  At exit too.
 */
static void
stop_fuse (void)
{
  if (fuse_server > 0) {
    kill (fuse_server, SIGKILL);
    waitpid (fuse_server, NULL, 0);
    fuse_server = 0;
  }
  if (mnt)
    umount2 (mnt, MNT_DETACH);
}

/* FIELD of /proc/PID/status, or NULL when PID is gone.  g_free it. */
static char *
status_field (pid_t pid, const char *field)
{
  g_autofree char *path = g_strdup_printf ("/proc/%d/status", (int) pid);
  g_autofree char *text = NULL;
  g_autofree char *key = g_strdup_printf ("\n%s:", field);
  const char *at;

  if (!g_file_get_contents (path, &text, NULL, NULL) ||
      (at = strstr (text, key)) == NULL)
    return NULL;
  at += strlen (key);
  return g_strstrip (g_strndup (at, strcspn (at, "\n")));
}

/* The processes whose parent is PARENT. */
static GArray *
children_of (pid_t parent)
{
  GArray *found = g_array_new (FALSE, FALSE, sizeof (pid_t));
  g_autoptr (GDir) proc = g_dir_open ("/proc", 0, NULL);
  const char *name;

  while (proc && (name = g_dir_read_name (proc))) {
    pid_t pid = (pid_t) atoi (name);
    g_autofree char *ppid = pid > 0 ? status_field (pid, "PPid") : NULL;

    if (ppid && atoi (ppid) == parent)
      g_array_append_val (found, pid);
  }
  return found;
}

/* How many processes have MARK in their command line. */
static unsigned
running_with (const char *mark, bool kill_them)
{
  g_autoptr (GDir) proc = g_dir_open ("/proc", 0, NULL);
  const char *name;
  unsigned n = 0;

  while (proc && (name = g_dir_read_name (proc))) {
    g_autofree char *path = g_strdup_printf ("/proc/%s/cmdline", name);
    g_autofree char *cmdline = NULL;
    gsize len;

    if (atoi (name) <= 0 ||
        !g_file_get_contents (path, &cmdline, &len, NULL))
      continue;
    for (gsize i = 0; i < len; i++)
      if (cmdline[i] == '\0')
        cmdline[i] = ' ';
    if (strstr (cmdline, mark)) {
      n++;
      if (kill_them)
        kill (atoi (name), SIGKILL);
    }
  }
  return n;
}

/* The children of the process that started, once known. */
static GArray *forked;

/* At exit: the start's children killed before the FUSE server goes (a
 * child still closing dies as that close ends), and whatever of ours
 * runs after.
 */
static void
kill_forked (void)
{
  for (guint i = 0; forked && i < forked->len; i++)
    kill (g_array_index (forked, pid_t, i), SIGKILL);
}

static void
kill_leftovers (void)
{
  if (top) {
    unit_sleep_ms (200);
    running_with (top, true);
  }
}

static void
write_script (const char *name)
{
  g_autofree char *path = g_build_filename (top, name, NULL);

  CHECK (g_file_set_contents (path, "#!/bin/sh\nwhile :; do sleep 1; "
                              "done\n", -1, NULL), "%s", path);
  CHECK (chmod (path, 0755) == 0, "chmod %s: %s", path, strerror (errno));
}

/* In the child named VICTIM: holds the FUSE file open and starts the
 * pair (its programs: the scripts), saying on OUT the start's result,
 * then waits for a line on IN before it reaps what it can and exits.
 */
static void G_GNUC_NORETURN
victim (int in, int out)
{
  g_autofree char *image = g_build_filename (mnt, "disk.img", NULL);
  g_autofree char *sup = g_build_filename (top, "sup.sh", NULL);
  g_autofree char *srv = g_build_filename (top, "srv.sh", NULL);
  g_autofree char *srv_log = g_build_filename (top, "server.log", NULL);
  g_autofree char *srv_pid = g_build_filename (top, "server.pid", NULL);
  g_autoptr (GPtrArray) sup_argv = g_ptr_array_new ();
  char *srv_argv[] = { srv, NULL };
  char err[512] = "", go;
  pid_t supervisor = 0, server = 0;
  g_autofree char *said = NULL;
  int fd, r;
  ssize_t ignored;

  prctl (PR_SET_NAME, VICTIM);
  fd = open (image, O_RDWR | O_CLOEXEC);
  g_ptr_array_add (sup_argv, sup);
  g_ptr_array_add (sup_argv, NULL);
  r = fd == -1 ? -2
    : mloop_supervised_start (sup_argv, srv_argv, srv_log, srv_pid, top,
                              START_TIMEOUT_MS, &supervisor, &server, err,
                              sizeof err);
  said = g_strdup_printf ("%d %s\n", r, r == -2 ? strerror (errno) : err);
  ignored = write (out, said, strlen (said));
  ignored = read (in, &go, 1);
  (void) ignored;
  /* What was left to be reaped by whoever reaps (mloop-dbus's reaper). */
  while (waitpid (-1, NULL, WNOHANG) > 0)
    ;
  _exit (0);
}

int
main (void)
{
  g_autofree char *log = NULL, *said = NULL;
  char buf[1024];
  int to_victim[2], from_victim[2];
  pid_t v;
  ssize_t n;
  bool dead = false;

  if (geteuid () != 0)
    unit_skip ("needs root: it mounts");
  if (getenv ("MLOOP_FUSE_STUCK_FLUSH") == NULL ||
      access (getenv ("MLOOP_FUSE_STUCK_FLUSH"), X_OK) == -1)
    unit_skip ("MLOOP_FUSE_STUCK_FLUSH names no helper");
  if (access ("/dev/fuse", R_OK | W_OK) == -1)
    unit_skip ("/dev/fuse: %s", strerror (errno));
  if (unshare (CLONE_NEWNS) == -1)
    unit_skip ("no mount namespace: %s", strerror (errno));
  CHECK (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0,
         "make / private: %s", strerror (errno));
  unit_deadline (30);
  top = unit_tmpdir ("/tmp");
  /* Run before the directory's removal: nothing of ours outlives it. */
  atexit (kill_leftovers);
  atexit (stop_fuse);
  atexit (kill_forked);
  mnt = g_build_filename (top, "mnt", NULL);
  CHECK (mkdir (mnt, 0755) == 0, "mkdir: %s", strerror (errno));
  write_script ("sup.sh");
  write_script ("srv.sh");

  log = g_build_filename (top, "fuse.log", NULL);
  fuse_server = fork ();
  CHECK (fuse_server != -1, "fork: %s", strerror (errno));
  if (fuse_server == 0) {
    int fd = open (log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

    prctl (PR_SET_PDEATHSIG, SIGKILL);
    dup2 (fd, STDERR_FILENO);
    execl (getenv ("MLOOP_FUSE_STUCK_FLUSH"), "fuse-stuck-flush", mnt, "0",
           "0", VICTIM, (char *) NULL);
    _exit (127);
  }
  for (int i = 0; i < 500; i++) {
    g_clear_pointer (&said, g_free);
    g_file_get_contents (log, &said, NULL, NULL);
    if (said && strstr (said, "serving"))
      break;
    unit_sleep_ms (20);
  }
  CHECK (said && strstr (said, "serving"), "fuse-stuck-flush: %s",
         said ? said : "(nothing)");

  CHECK (pipe2 (to_victim, O_CLOEXEC) == 0 && pipe2 (from_victim, O_CLOEXEC)
         == 0, "pipe: %s", strerror (errno));
  v = fork ();
  CHECK (v != -1, "fork: %s", strerror (errno));
  if (v == 0) {
    /* The test's ends: a test that ends lets the victim end. */
    close (to_victim[1]);
    close (from_victim[0]);
    victim (to_victim[0], from_victim[1]);
  }
  close (to_victim[0]);
  close (from_victim[1]);
  n = read (from_victim[0], buf, sizeof buf - 1);
  buf[n > 0 ? n : 0] = '\0';
  CHECK (g_str_has_prefix (buf, "-1 ") && strstr (buf, "within"),
         "the start did not time out: %s", buf);

  /* Its child waits in its close, killed: it dies once that ends. */
  forked = children_of (v);
  CHECK (forked->len == 1, "the starting process has %u children, not "
         "the 1 it forked", forked->len);
  {
    const pid_t child = g_array_index (forked, pid_t, 0);
    g_autofree char *shared = status_field (child, "ShdPnd");
    g_autofree char *own = status_field (child, "SigPnd");
    const guint64 kill_bit = 1ULL << (SIGKILL - 1);

    CHECK (shared && own &&
           ((g_ascii_strtoull (shared, NULL, 16) |
             g_ascii_strtoull (own, NULL, 16)) & kill_bit),
           "the start's child, still closing what it inherited, was not "
           "killed at the start's timeout (pending signals %s, %s)",
           shared ? shared : "?", own ? own : "?");
  }

  /* The FUSE server goes: the close ends, and with it the child. */
  stop_fuse ();
  for (int i = 0; i < 250 && !dead; i++) {
    g_autofree char *state = status_field (g_array_index (forked, pid_t, 0),
                                           "State");

    dead = state == NULL || state[0] == 'Z';
    if (!dead)
      unit_sleep_ms (20);
  }
  /* Anything exec'd has had time to show its command line. */
  unit_sleep_ms (200);
  CHECK (running_with (top, false) == 0, "%u of the start's programs run "
         "after it failed", running_with (top, false));
  CHECK (dead, "the start's child lives on after its close ended");

  n = write (to_victim[1], "g", 1);
  CHECK (waitpid (v, NULL, 0) == v, "waitpid: %s", strerror (errno));
  return 0;
}
