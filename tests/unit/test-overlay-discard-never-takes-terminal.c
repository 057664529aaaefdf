/* `mloop overlay discard` opens the overlay a second time, under the
 * state lock, to lock it and remove it (device/overlay_file.c).  What
 * its path names then is not what was checked before the lock: a
 * terminal put there meanwhile must not become the controlling terminal
 * of the discard, which, run as a session leader without one (a
 * service, a job started by setsid), would take the first terminal it
 * opens without O_NOCTTY, and with it the terminal's signals.
 *
 * Deterministic: the discard runs in a child that leads a new session;
 * this test holds the state lock while the child reads the header,
 * waits (inotify) for it to close it, renames a symlink to a new
 * pseudo-terminal over the overlay's name and lets the discard go on.
 * No root: about 0.05 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backing.h"
#include "held_discard.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* The child's exit codes. */
enum { REFUSED = 1, TOOK_TERMINAL = 2, REMOVED = 3, NO_SESSION = 4 };

/* The discard, run as a session leader without a controlling terminal. */
static int
discard_in_new_session (const char *path)
{
  char err[512];
  int fd, r;

  if (setsid () == -1)
    return NO_SESSION;
  r = mloop_overlay_file_discard (path, err, sizeof err);
  if (r == -1)
    fprintf (stderr, "discard refused: %s\n", err);
  fd = open ("/dev/tty", O_RDONLY | O_NOCTTY | O_CLOEXEC);
  return fd != -1 ? TOOK_TERMINAL : r == -1 ? REFUSED : REMOVED;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], link_path[4096];
  struct held_discard discard;
  int master, status;
  const char *slave;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (link_path, sizeof link_path, "%s/terminal", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_empty_overlay (base_path, path);

  /* A terminal no session has: its first opener without O_NOCTTY that
   * leads a session without one takes it.
   */
  master = posix_openpt (O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master == -1 || grantpt (master) == -1 || unlockpt (master) == -1 ||
      (slave = ptsname (master)) == NULL)
    unit_skip ("no pseudo-terminal: %s", strerror (errno));
  CHECK (symlink (slave, link_path) == 0, "symlink: %s", strerror (errno));

  held_discard_start (&discard, path, discard_in_new_session);
  CHECK (rename (link_path, path) == 0, "rename: %s", strerror (errno));
  status = held_discard_finish (&discard);
  CHECK (WIFEXITED (status), "the discard died");
  CHECK (WEXITSTATUS (status) != NO_SESSION, "setsid: the child leads a "
         "group already");
  CHECK (WEXITSTATUS (status) != TOOK_TERMINAL, "the discard took the "
         "terminal put at the overlay's name as its controlling terminal");
  CHECK (WEXITSTATUS (status) == REFUSED, "the discard did not refuse the "
         "terminal put at the overlay's name (exit %d)",
         WEXITSTATUS (status));
  close (master);
  printf ("ok: discard never takes a terminal put at the overlay's name\n");
  return 0;
}
