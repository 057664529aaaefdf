/* A commit into a block device that another process holds open in a
 * descriptor table that /proc/PID/fd does not show.  /proc/PID/fd is
 * the table of the thread group's leader: a thread with a table of its
 * own (clone without CLONE_FILES, or unshare (CLONE_FILES)) keeps its
 * descriptors in /proc/PID/task/TID/fd only, and once the leader has
 * exited (pthread_exit from main) /proc/PID/fd lists nothing at all,
 * while the other threads still hold the disk.  Not looked for is not
 * absent: the commit would write under such a holder.
 *
 * Here a child process holds the disk from a thread, once with the
 * leader gone, once from a thread whose table is its own.  Needs root
 * and loop devices (else it skips).  About 1.2 s (the commit waits out
 * a brief opener each time).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "overlay.h"
#include "loop_device.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

/* The holder's own copy: the node the parent names lies on the stack
 * of the leader, which exits before the holder may have read it (ASan's
 * stacks go with their thread).
 */
static char disk_node[64];
static int ready_fd;
static bool own_table;

/* Opens the disk, says so, and holds it until killed. */
static void *
holder (void *unused)
{
  int fd;

  (void) unused;
  if (own_table && unshare (CLONE_FILES) == -1)
    _exit (1);
  fd = open (disk_node, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || write (ready_fd, "r", 1) != 1)
    _exit (1);
  for (;;)
    pause ();
  return NULL;
}

/* A child whose thread holds NODE, the leader gone when !OWN_TABLE, else
 * the thread's table its own: its pid, once it holds the disk.
 */
static pid_t
start_holder (const char *node, bool own, int held)
{
  int ready[2];
  pid_t pid;
  char c;

  CHECK (pipe (ready) == 0, "pipe: %s", strerror (errno));
  pid = fork ();
  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    pthread_t t;

    prctl (PR_SET_PDEATHSIG, SIGKILL);
    close (held);
    close (ready[0]);
    snprintf (disk_node, sizeof disk_node, "%s", node);
    ready_fd = ready[1];
    own_table = own;
    if (pthread_create (&t, NULL, holder, NULL) != 0)
      _exit (1);
    if (own) {
      /* The leader lives on, its own table holding nothing of the
       * disk: the thread's table is the one that does.
       */
      for (;;)
        pause ();
    }
    pthread_exit (NULL);
  }
  close (ready[1]);
  CHECK (read (ready[0], &c, 1) == 1, "the holder did not start");
  close (ready[0]);
  /* Let the leader be gone before the commit looks. */
  unit_sleep_ms (100);
  return pid;
}

/* Commits PATH into NODE while HOLDER holds it: whether it was refused. */
static bool
refused (const char *path, const char *node, const char *holder_kind)
{
  char err[512];
  int r = mloop_overlay_merge (path, node, false, true, err, sizeof err);

  if (r == 0)
    printf ("NOT refused: committed under %s\n", holder_kind);
  else
    printf ("refused under %s: %s\n", holder_kind, err);
  return r < 0;
}

int
main (void)
{
  const char *dir;
  char image[4096], path[4096], node[64];
  bool failed = false;
  int held;
  pid_t pid;

  unit_free_loop (node, sizeof node);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (image, sizeof image, "%s/disk.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a disk");
  held = unit_loop_attach (node, image, false);

  unit_make_overlay (node, path);
  pid = start_holder (node, false, held);
  failed |= !refused (path, node, "a thread whose leader exited");
  kill (pid, SIGKILL);
  waitpid (pid, NULL, 0);

  if (access (path, F_OK) == -1)
    unit_make_overlay (node, path);
  pid = start_holder (node, true, held);
  failed |= !refused (path, node, "a thread with a descriptor table of its "
                      "own");
  kill (pid, SIGKILL);
  waitpid (pid, NULL, 0);

  close (held);
  CHECK (!failed, "a commit wrote a disk another process held open from a "
         "thread /proc/PID/fd does not show");
  printf ("ok: a commit sees a holder in any thread's descriptor table\n");
  return 0;
}
