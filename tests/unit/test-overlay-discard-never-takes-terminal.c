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
#include "device_state.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* The child's exit codes. */
enum { REFUSED = 1, TOOK_TERMINAL = 2, REMOVED = 3, NO_SESSION = 4 };

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], link_path[4096], err[512];
  char events[4096] __attribute__ ((aligned (8)));
  int fd, in, lock, master, status, r;
  bool closed = false;
  const char *slave;
  pid_t pid;

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

  in = inotify_init1 (IN_CLOEXEC);
  if (in == -1)
    unit_skip ("inotify: %s", strerror (errno));
  CHECK (inotify_add_watch (in, path, IN_CLOSE_NOWRITE) >= 0,
         "inotify_add_watch %s: %s", path, strerror (errno));
  lock = mloop_state_lock (err, sizeof err);
  CHECK (lock >= 0, "state lock: %s", err);

  pid = fork ();
  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    /* The lock's description is shared with the parent: not the child's. */
    close (lock);
    if (setsid () == -1)
      _exit (NO_SESSION);
    r = mloop_overlay_file_discard (path, err, sizeof err);
    if (r == -1)
      fprintf (stderr, "discard refused: %s\n", err);
    fd = open ("/dev/tty", O_RDONLY | O_NOCTTY | O_CLOEXEC);
    _exit (fd != -1 ? TOOK_TERMINAL : r == -1 ? REFUSED : REMOVED);
  }
  /* The discard has read the header and waits for the state lock. */
  while (!closed) {
    ssize_t n = read (in, events, sizeof events);

    CHECK (n > 0, "inotify: %s", n < 0 ? strerror (errno) : "none");
    for (char *p = events; p < events + n; ) {
      const struct inotify_event *ev = (const struct inotify_event *) p;

      if (ev->mask & IN_CLOSE_NOWRITE)
        closed = true;
      p += sizeof *ev + ev->len;
    }
  }
  close (in);
  CHECK (rename (link_path, path) == 0, "rename: %s", strerror (errno));
  mloop_state_unlock (lock);
  CHECK (waitpid (pid, &status, 0) == pid, "waitpid: %s", strerror (errno));
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
