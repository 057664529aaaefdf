/* Attaches choosing a device at the same time claim the index they
 * chose (mloop_state_claim_index): a second claim of one index fails
 * with EWOULDBLOCK while the first is held, from another descriptor as
 * from another process, and succeeds once it is let go; other indexes
 * are free meanwhile.  A claim's file is in the private runtime
 * directory only while held (the kernel tests check that a detach
 * leaves the directory as it found it), and one a dead attach left is
 * taken over.  In a temporary MLOOP_RUNTIME_DIR, so no root is needed.
 * About 0.01 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include "device_state.h"
#include "unit.h"

/* In a child process: whether INDEX could be claimed there. */
static bool
claimable_elsewhere (int index)
{
  pid_t pid = fork ();
  int status;

  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    int fd = mloop_state_claim_index (index);

    mloop_state_release_claim (index, fd);
    _exit (fd >= 0 ? 0 : 1);
  }
  CHECK (waitpid (pid, &status, 0) == pid, "waitpid");
  return WIFEXITED (status) && WEXITSTATUS (status) == 0;
}

int
main (void)
{
  g_autofree char *run = g_build_filename (unit_tmpdir ("/tmp"), "run", NULL);
  g_autofree char *file = g_build_filename (run, ".claim-nbd3", NULL);
  struct stat st;
  int first, second;

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  first = mloop_state_claim_index (3);
  CHECK (first >= 0, "the first claim of nbd3: %s", strerror (errno));
  CHECK (stat (run, &st) == 0 && (st.st_mode & 077) == 0,
         "%s is not private to its owner", run);
  CHECK (stat (file, &st) == 0, "%s: %s", file, strerror (errno));
  second = mloop_state_claim_index (3);
  CHECK (second == -1 && errno == EWOULDBLOCK,
         "nbd3 claimed twice at once (%d: %s)", second, strerror (errno));
  CHECK (!claimable_elsewhere (3), "nbd3 claimed by another process while "
         "held");
  CHECK (claimable_elsewhere (4), "nbd4 not claimable while only nbd3 is "
         "held");
  mloop_state_release_claim (3, first);
  CHECK (access (file, F_OK) == -1 && errno == ENOENT,
         "%s stayed once let go", file);
  /* Left by an attach that died holding it. */
  close (open (file, O_RDWR | O_CREAT, 0600));
  CHECK (claimable_elsewhere (3), "nbd3 not claimable once let go, its "
         "file left behind");
  printf ("ok: one claim of an index at a time\n");
  return 0;
}
