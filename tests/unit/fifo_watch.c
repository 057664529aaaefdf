/* A FIFO whose every open is seen (fifo_watch.h). */
#include <errno.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fifo_watch.h"
#include "unit.h"

int
fifo_watch (const char *path)
{
  int in;

  if (mkfifo (path, 0600) == -1)
    unit_skip ("mkfifo: %s", strerror (errno));
  in = inotify_init1 (IN_CLOEXEC | IN_NONBLOCK);
  if (in == -1)
    unit_skip ("inotify: %s", strerror (errno));
  CHECK (inotify_add_watch (in, path, IN_OPEN) >= 0,
         "inotify_add_watch %s: %s", path, strerror (errno));
  return in;
}

bool
fifo_watch_opened (int in)
{
  char events[4096] __attribute__ ((aligned (8)));
  ssize_t n = read (in, events, sizeof events);

  return !(n == -1 && errno == EAGAIN);
}
