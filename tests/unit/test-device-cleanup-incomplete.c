/* mloop_cleanup_incomplete() (device/attach.c) removes the directories
 * of attaches that died half-way, those without a state file, and stops
 * the server their pid file names; it leaves attached devices alone, and
 * a pid file's process alone when its command line does not name the
 * directory's socket (the pid was reused).  The temporary overlay the
 * half-made attach had claimed is removed with its directory.  In a temporary
 * MLOOP_RUNTIME_DIR, with this program re-run as the "server": no root.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include <glib.h>

#include "attach.h"
#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

static pid_t children[2];
static const char *self;        /* argv[0]: /proc/self/exe may be valgrind */

/* A stand-in server: this program, with MARK on its command line.  It
 * exits by itself after a minute, should the test leave it behind.
 */
static pid_t
start_child (const char *mark)
{
  pid_t pid = fork ();

  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    execl (self, self, "--sleep", mark, (char *) NULL);
    _exit (127);
  }
  return pid;
}

static void
kill_children (void)
{
  for (int i = 0; i < 2; i++)
    if (children[i] > 0) {
      kill (children[i], SIGKILL);
      waitpid (children[i], NULL, 0);
    }
}

/* Whether the command line of PID mentions MARK yet (exec may lag). */
static void
wait_for_exec (pid_t pid, const char *mark)
{
  g_autofree char *path = g_strdup_printf ("/proc/%d/cmdline", (int) pid);

  for (int i = 0; i < 5000; i++) {
    g_autofree char *cmdline = NULL;
    gsize len;

    if (g_file_get_contents (path, &cmdline, &len, NULL) && len > 0 &&
        memmem (cmdline, len, mark, strlen (mark)))
      return;
    g_usleep (1000);
  }
  unit_fail (__FILE__, __LINE__, "exec", "pid %d never ran with %s", (int) pid,
             mark);
}

static void
write_pid (const char *dir, const char *name, pid_t pid)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autofree char *text = g_strdup_printf ("%d\n", (int) pid);

  CHECK (g_file_set_contents (path, text, -1, NULL), "writing %s", path);
}

int
main (int argc, char **argv)
{
  if (argc == 3 && strcmp (argv[1], "--sleep") == 0) {
    alarm (60);
    pause ();
    return 0;
  }
  self = argv[0];

  g_autofree char *run = g_build_filename (unit_tmpdir ("/tmp"), "run", NULL);
  struct mloop_device_state attached = {
    .index = 4, .file = "/images/attached.img", .size = 1 << 20,
    .block_size = 512, .connections = 1, .threads = 1,
    .server = mloop_server_kind_default (),
  };
  struct mloop_device_state half = { .index = -1 }, got;
  g_autofree char *half_sock = NULL, *overlay_dir = NULL;
  char err[256];
  int status;

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  atexit (kill_children);
  CHECK (mloop_state_create (&attached, err, sizeof err) == 0, "%s", err);
  CHECK (mloop_state_save (&attached, err, sizeof err) == 0, "%s", err);
  CHECK (mloop_state_create (&half, err, sizeof err) == 0, "%s", err);
  half_sock = mloop_state_path (&half, MLOOP_DIR_SOCKET);
  /* It had claimed its image with a temporary overlay, made already. */
  overlay_dir = g_build_filename (run, "..", "mloop-half-XXXXXX", NULL);
  CHECK (g_mkdtemp (overlay_dir) != NULL, "mkdtemp: %s", strerror (errno));
  half.file = g_strdup ("/images/half.img");
  half.server = mloop_server_kind_default ();
  half.overlay = g_build_filename (overlay_dir, "overlay", NULL);
  half.overlay_temporary = true;
  CHECK (g_file_set_contents (half.overlay, "map", -1, NULL), "overlay");
  CHECK (mloop_state_save_claim (&half, err, sizeof err) == 0, "%s", err);

  /* The half-made attach's server, started with its socket ... */
  children[0] = start_child (half_sock);
  wait_for_exec (children[0], half_sock);
  write_pid (half.dir, MLOOP_DIR_SERVER_PID, children[0]);
  /* ... and a "supervisor" pid now some other process. */
  children[1] = start_child ("unrelated");
  wait_for_exec (children[1], "unrelated");
  write_pid (half.dir, MLOOP_DIR_SUPERVISOR_PID, children[1]);

  CHECK (mloop_cleanup_incomplete () == 1, "cleanup did not remove one dir");

  CHECK (!g_file_test (half.dir, G_FILE_TEST_EXISTS),
         "the half-made attach's %s is still there", half.dir);
  CHECK (!g_file_test (overlay_dir, G_FILE_TEST_EXISTS),
         "the half-made attach's temporary overlay %s is still there",
         half.overlay);
  /* Its server was stopped: a zombie now, unless the library reaped it. */
  pid_t r = waitpid (children[0], &status, WNOHANG);
  CHECK ((r == children[0] && WIFSIGNALED (status)) ||
         (r == -1 && errno == ECHILD),
         "the half-made attach's server %d still runs", (int) children[0]);
  children[0] = 0;
  /* The process that merely has a recycled pid lives on. */
  CHECK (waitpid (children[1], &status, WNOHANG) == 0,
         "pid %d, not the supervisor, was stopped", (int) children[1]);

  CHECK (mloop_state_load (attached.dir, &got) == 0,
         "the attached device's state is gone");
  CHECK (got.index == 4, "attached device index %d", got.index);
  mloop_state_clear (&got);
  CHECK (mloop_cleanup_incomplete () == 0, "a second cleanup found more");

  g_free (attached.dir);
  g_free (half.dir);
  g_free (half.overlay);
  g_free (half.file);
  printf ("ok: a half-made attach removed and its server stopped\n");
  return 0;
}
