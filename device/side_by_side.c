/* mloop — a supervisor and its first server started side by side. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <glib.h>

#include "errmsg.h"
#include "held_image.h"
#include "side_by_side.h"

/* One program of the pair. */
struct launch {
  char *path;                   /* absolute: no PATH search after fork */
  char **argv;
  int log_fd;                   /* its stdout and stderr */
};

static int
launch_prepare (struct launch *l, char **argv, const char *log_file,
                const char *what, char *err, size_t errlen)
{
  l->argv = argv;
  l->path = strchr (argv[0], '/') ? g_strdup (argv[0])
    : g_find_program_in_path (argv[0]);
  if (l->path == NULL)
    return mloop_fail (err, errlen, "cannot start %s: %s is not installed",
                       what, argv[0]);
  l->log_fd = open (log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC,
                    0600);
  if (l->log_fd == -1)
    return mloop_fail (err, errlen, "cannot create %s: %s", log_file,
                       strerror (errno));
  return 0;
}

static void
launch_clear (struct launch *l)
{
  g_free (l->path);
  if (l->log_fd != -1)
    close (l->log_fd);
}

static void
write_text (int fd, const char *text)
{
  ssize_t ignored = write (fd, text, strlen (text));

  (void) ignored;
}

/* In a forked child: puts the held image (held_image.h), if any, at
 * MLOOP_HELD_IMAGE_FD, inheritable.  Returns the first descriptor to
 * close.
 */
static unsigned
keep_held_image (void)
{
  int fd = mloop_held_image_fd ();

  if (fd == -1)
    return MLOOP_HELD_IMAGE_FD;
  if (fd == MLOOP_HELD_IMAGE_FD)
    fcntl (fd, F_SETFD, 0);
  else
    dup2 (fd, MLOOP_HELD_IMAGE_FD);
  return MLOOP_HELD_IMAGE_FD + 1;
}

/* In a forked child: its own session, working directory /, no blocked
 * signal, stdin NULL_FD,
 * stdout and stderr its log, no other descriptor but a held image
 * (held_image.h), then exec.  Only
 * async-signal-safe calls: the parent may have other threads.
 */
static void G_GNUC_NORETURN
launch_exec (const struct launch *l, int null_fd)
{
  sigset_t none;

  sigemptyset (&none);
  sigprocmask (SIG_SETMASK, &none, NULL);
  setsid ();
  /* Not the caller's working directory, which would stay busy for the
   * device's whole life (the server's too: it inherits this one).
   */
  if (chdir ("/") == -1)
    _exit (127);
  dup2 (null_fd, STDIN_FILENO);
  dup2 (l->log_fd, STDOUT_FILENO);
  dup2 (l->log_fd, STDERR_FILENO);
  close_range (keep_held_image (), ~0U, 0);
  execv (l->path, l->argv);
  write_text (STDERR_FILENO, "mloop: cannot execute ");
  write_text (STDERR_FILENO, l->path);
  write_text (STDERR_FILENO, "\n");
  _exit (127);
}

/* Writes PID in decimal over the end of ARG: async-signal-safe. */
static void
put_pid (char *arg, pid_t pid)
{
  char digits[24];
  int n = 0;

  do
    digits[n++] = (char) ('0' + pid % 10);
  while ((pid /= 10) > 0);
  arg += strlen (arg);
  while (n > 0)
    *arg++ = digits[--n];
  *arg = '\0';
}

/* In a forked child: closes every descriptor from 3 up but the N in
 * KEEP (-1 for none).  Async-signal-safe.
 */
static void
close_all_but (int *keep, int n)
{
  unsigned from = 3;

  /* Sorted, by insertion: N is a handful. */
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
      int t = keep[j];

      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  for (int i = 0; i < n; i++) {
    if (keep[i] < (int) from)
      continue;
    if ((unsigned) keep[i] > from)
      close_range (from, (unsigned) keep[i] - 1, 0);
    from = (unsigned) keep[i] + 1;
  }
  close_range (from, ~0U, 0);
}

/* Under emulation a process start costs 150-250 ms before its main runs
 * and the supervisor used to start its server only once it ran itself:
 * one after the other they were most of an attach's time.  Forked by
 * hand, not with g_spawn, because the supervisor must be the server's
 * parent (to reap it and say how it ended) and only the forked child
 * knows the server's pid before it execs.
 */
static void G_GNUC_NORETURN
run_pair (struct launch *sup, char *adopt_arg, struct launch *srv,
          int null_fd)
{
  int keep[] = { sup->log_fd, srv->log_fd, null_fd, mloop_held_image_fd () };
  pid_t server;

  /* The descriptors the parent held closed first, before the server is
   * forked: a close may wait as long as the file's owner likes (a FUSE
   * file's FLUSH, in a caller's descriptor mloop-dbus holds), and a
   * start that times out kills this process, which then dies the moment
   * its closes end, with nothing forked and nothing exec'd.
   */
  close_all_but (keep, G_N_ELEMENTS (keep));
  /* nbdkit's daemon, orphaned by its first process, comes to us. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  server = fork ();
  if (server == 0)
    launch_exec (srv, null_fd);
  if (server == -1) {
    write_text (sup->log_fd, "mloop-supervisor: cannot fork the server\n");
    _exit (EXIT_FAILURE);
  }
  put_pid (adopt_arg, server);
  launch_exec (sup, null_fd);
}

int
mloop_spawn_side_by_side (GPtrArray *supervisor_argv,
                          const char *supervisor_log,
                          char **server_argv, const char *server_log,
                          pid_t *supervisor, char *err, size_t errlen)
{
  struct launch sup = { .log_fd = -1 }, srv = { .log_fd = -1 };
  /* Room for any pid after the '=', written in the child. */
  char *adopt_arg = g_malloc0 (sizeof "--adopt=" + 24);
  int null_fd = -1, r = -1;
  pid_t pid;

  *supervisor = 0;
  strcpy (adopt_arg, "--adopt=");
  /* Options may come anywhere before "--": right after the program. */
  g_ptr_array_insert (supervisor_argv, 1, adopt_arg);
  if (launch_prepare (&sup, (char **) supervisor_argv->pdata,
                      supervisor_log, "the supervisor", err, errlen) == -1 ||
      launch_prepare (&srv, server_argv, server_log, "the server",
                      err, errlen) == -1)
    goto out;
  null_fd = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd == -1) {
    mloop_fail (err, errlen, "/dev/null: %s", strerror (errno));
    goto out;
  }
  pid = fork ();
  if (pid == 0)
    run_pair (&sup, adopt_arg, &srv, null_fd);
  if (pid == -1) {
    mloop_fail (err, errlen, "cannot start the supervisor: fork: %s",
                strerror (errno));
    goto out;
  }
  *supervisor = pid;
  r = 0;
 out:
  if (null_fd != -1)
    close (null_fd);
  launch_clear (&sup);
  launch_clear (&srv);
  return r;
}
