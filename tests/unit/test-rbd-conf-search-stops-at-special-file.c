/* librados's search for a Ceph configuration (ceph_conf.c does it as
 * librados does) passes over a place that is missing, unreadable or a
 * directory, but reads a FIFO or a device there as the configuration
 * and looks no further.  So must the search: going on to the next
 * place, attach would record, and the device's servers serve, a cluster
 * the caller's own librados and rbd tool never read; the special file
 * found is refused instead (no server reads one).  And never opened:
 * root opening a FIFO a user linked into the search wakes its writer
 * (a watchdog's node would start it, a tape's rewind it); it is only
 * looked at.  Without /proc, where a regular file looked at cannot be
 * opened through its look (/proc/self/fd/N), neither may a FIFO
 * swapped in over it just after the look be opened: the window is made
 * certain, not raced for, this program's open() standing in for the C
 * library's (the engine is linked in statically) and renaming a FIFO
 * over the file just after the search's look at it; inotify must see
 * no open of the FIFO.  About 0.3 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/mount.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>

#include "ceph_conf.h"
#include "fifo_watch.h"
#include "store_name.h"
#include "unit.h"

/* Once armed, the next look (O_PATH) at SWAP_OVER renames SWAP_FIFO
 * over it, and what went wrong doing so is in SWAP_ERROR.
 */
static char swap_over[4096], swap_fifo[4096];
static bool swap_armed;
static int swap_error;

int
open (const char *name, int flags, ...)
{
  mode_t mode = 0;
  int fd;

  if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE) {
    va_list ap;

    va_start (ap, flags);
    mode = va_arg (ap, mode_t);
    va_end (ap);
  }
  fd = openat (AT_FDCWD, name, flags, mode);
  if (fd >= 0 && swap_armed && (flags & O_PATH) &&
      strcmp (name, swap_over) == 0) {
    swap_armed = false;
    if (rename (swap_fifo, swap_over) == -1)
      swap_error = errno;
  }
  return fd;
}

/* $CEPH_CONF=FIRST,NEXT: the search must stop at FIRST, a special file,
 * and attach refuse it.
 */
static void
stops_at (const char *first, const char *next)
{
  g_autofree char *list = g_strconcat (first, ",", next, NULL);
  g_autofree char *pinned = NULL;
  char *found = NULL;
  char err[512] = "";
  int fd;

  setenv ("CEPH_CONF", list, 1);
  fd = mloop_ceph_conf_open_searched (&found);
  CHECK (fd >= 0 && found && strcmp (found, first) == 0,
         "$CEPH_CONF=%s: the search found %s (%s), not %s, which librados "
         "reads", list, found ? found : "none",
         fd < 0 ? strerror (-fd) : "opened", first);
  close (fd);
  free (found);
  pinned = mloop_rbd_name_pinned ("rbd:pool/img", err, sizeof err);
  CHECK (pinned == NULL, "$CEPH_CONF=%s: attach recorded %s, where "
         "librados reads %s", list, pinned, first);
  CHECK (strstr (err, first) != NULL, "$CEPH_CONF=%s: refused without "
         "naming %s: %s", list, first, err);
}

/* Waits until PID waits in its open (system call 257, openat, in
 * /proc/PID/syscall), so that an open of the FIFO would wake it.
 */
static void
blocked_in_open (pid_t pid)
{
  g_autofree char *path = g_strdup_printf ("/proc/%d/syscall", (int) pid);

  for (int tries = 0; tries < 500; tries++) {
    g_autofree char *line = NULL;

    if (g_file_get_contents (path, &line, NULL, NULL) &&
        g_str_has_prefix (line, "257 "))
      return;
    usleep (10 * 1000);
  }
  unit_skip ("cannot tell the FIFO's writer waits in its open (%s)", path);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  g_autofree char *fifo = g_build_filename (dir, "fifo.conf", NULL);
  g_autofree char *next = g_build_filename (dir, "next.conf", NULL);
  g_autofree char *sub = g_build_filename (dir, "sub.conf", NULL);
  FILE *f = fopen (next, "w");

  CHECK (f != NULL, "%s: cannot make it", next);
  fputs ("[global]\nmon_host = 192.0.2.1\n", f);
  fclose (f);
  chmod (next, 0644);
  CHECK (mkfifo (fifo, 0644) == 0, "%s: %s", fifo, strerror (errno));
  CHECK (mkdir (sub, 0755) == 0, "%s: %s", sub, strerror (errno));
  unsetenv ("CEPH_ARGS");
  unsetenv ("CEPH_KEYRING");
  unsetenv ("CEPH_LIB");

  /* A writer waits on the FIFO for as long as no one opens it to
   * read: the search must leave it waiting.
   */
  {
    pid_t writer = fork ();
    int status;

    CHECK (writer >= 0, "fork: %s", strerror (errno));
    if (writer == 0) {
      int w = open (fifo, O_WRONLY);

      _exit (w >= 0 ? 0 : 1);
    }
    blocked_in_open (writer);
    stops_at (fifo, next);
    usleep (200 * 1000);
    CHECK (waitpid (writer, &status, WNOHANG) == 0,
           "the search opened FIFO %s: its writer's open returned", fifo);
    kill (writer, SIGKILL);
    waitpid (writer, &status, 0);
  }
  stops_at ("/dev/null", next);

  /* A directory is passed over, as librados does. */
  {
    g_autofree char *list = g_strconcat (sub, ",", next, NULL);
    char *found = NULL;
    int fd;

    setenv ("CEPH_CONF", list, 1);
    fd = mloop_ceph_conf_open_searched (&found);
    CHECK (fd >= 0 && found && strcmp (found, next) == 0,
           "$CEPH_CONF=%s: the search found %s, not %s", list,
           found ? found : "none", next);
    close (fd);
    free (found);
  }
  /* Without /proc (a chroot, a small container), a regular file found
   * is still the one: not passed over for the next place, which
   * librados never reads.  And a FIFO swapped in over it just after the
   * search looked at it is never opened: the file looked at is the one
   * found.  In a child in a mount namespace of its own, where /proc is
   * unmounted; it says what it found, each time, through a pipe and is
   * killed (its exit would be LeakSanitizer's or valgrind's to judge,
   * and both need /proc).  Not run without root.
   */
  {
    g_autofree char *first = g_build_filename (dir, "first.conf", NULL);
    g_autofree char *list = g_strconcat (first, ",", next, NULL);
    g_autofree char *fifo_in = g_build_filename (dir, "swapped-in", NULL);
    char said[8192] = "", *swapped;
    int answer[2], status, in;
    ssize_t n;
    pid_t child;

    CHECK (g_file_set_contents (first, "[global]\n", -1, NULL),
           "making %s", first);
    in = fifo_watch (fifo_in);
    setenv ("CEPH_CONF", list, 1);
    CHECK (pipe (answer) == 0, "pipe: %s", strerror (errno));
    child = fork ();
    CHECK (child >= 0, "fork: %s", strerror (errno));
    if (child == 0) {
      char *found = NULL, *found_swapped = NULL;
      char line[sizeof said] = "77";
      struct stat sb;
      int fd;

      close (answer[0]);
      if (unshare (CLONE_NEWNS) == 0 &&
          mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0 &&
          umount2 ("/proc", MNT_DETACH) == 0) {
        fd = mloop_ceph_conf_open_searched (&found);
        if (fd >= 0)
          close (fd);
        else {
          free (found);
          found = NULL;
        }
        snprintf (swap_over, sizeof swap_over, "%s", first);
        snprintf (swap_fifo, sizeof swap_fifo, "%s", fifo_in);
        swap_armed = true;
        fd = mloop_ceph_conf_open_searched (&found_swapped);
        snprintf (line, sizeof line, "%s\n%s%s%s",
                  found ? found : "none",
                  swap_armed ? "never looked at "
                  : swap_error ? strerror (swap_error) : "",
                  fd < 0 ? strerror (-fd) : found_swapped,
                  fd >= 0 && (fstat (fd, &sb) < 0 || !S_ISREG (sb.st_mode))
                  ? " (no regular file)" : "");
      }
      if (write (answer[1], line, strlen (line)) < 0)
        _exit (1);
      close (answer[1]);
      raise (SIGKILL);
    }
    close (answer[1]);
    n = read (answer[0], said, sizeof said - 1);
    close (answer[0]);
    waitpid (child, &status, 0);
    said[n > 0 ? n : 0] = '\0';
    if (strcmp (said, "77") == 0)
      printf ("# without /proc: not run (no mount namespace here)\n");
    else {
      swapped = strchr (said, '\n');
      CHECK (swapped != NULL, "without /proc the search said: %s", said);
      *swapped++ = '\0';
      CHECK (strcmp (said, first) == 0, "without /proc the search passed "
             "over %s, which librados reads (found %s)", first, said);
      CHECK (!fifo_watch_opened (in), "without /proc the search opened "
             "the FIFO swapped in over %s after its look (found: %s)",
             first, swapped);
      CHECK (strcmp (swapped, first) == 0, "without /proc, with a FIFO "
             "swapped in over %s after its look, the search found: %s",
             first, swapped);
    }
    close (in);
  }
  return 0;
}
