/* A discard held between its two looks at the overlay (held_discard.h). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device_state.h"
#include "held_discard.h"
#include "overlay_file.h"
#include "unit.h"

/* Waits until the watch IN reports IN_CLOSE_NOWRITE. */
static void
wait_closed (int in)
{
  char events[4096] __attribute__ ((aligned (8)));
  bool closed = false;

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
}

void
held_discard_start (struct held_discard *h, const char *path,
                    int (*run) (const char *path))
{
  char err[512];
  int in = inotify_init1 (IN_CLOEXEC);

  if (in == -1)
    unit_skip ("inotify: %s", strerror (errno));
  CHECK (inotify_add_watch (in, path, IN_CLOSE_NOWRITE) >= 0,
         "inotify_add_watch %s: %s", path, strerror (errno));
  h->lock = mloop_state_lock (err, sizeof err);
  CHECK (h->lock >= 0, "state lock: %s", err);
  h->pid = fork ();
  CHECK (h->pid >= 0, "fork: %s", strerror (errno));
  if (h->pid == 0) {
    /* The lock's description is shared with the parent: not the child's.
     * _exit: the parent's exit handlers (unit_remove_at_exit) are its own.
     */
    close (h->lock);
    _exit (run (path));
  }
  /* The discard has read the header and waits for the state lock. */
  wait_closed (in);
  close (in);
}

int
held_discard_finish (struct held_discard *h)
{
  int status;

  mloop_state_unlock (h->lock);
  CHECK (waitpid (h->pid, &status, 0) == h->pid, "waitpid: %s",
         strerror (errno));
  return status;
}

int
held_discard_run (const char *path)
{
  char err[512];
  int r = mloop_overlay_file_discard (path, err, sizeof err);

  if (r == -1)
    fprintf (stderr, "discard refused: %s\n", err);
  return r == -1 ? 1 : 0;
}
