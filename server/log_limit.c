/* mloop-server — one bound on every log line a client can repeat (see
 * log_limit.h).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "log_limit.h"

static struct {
  pthread_mutex_t lock;
  int64_t window_start_ms;      /* when the current window began */
  unsigned lines;               /* written in it */
  unsigned long suppressed;     /* dropped since the last report */
} lim = { .lock = PTHREAD_MUTEX_INITIALIZER, .window_start_ms = INT64_MIN / 2 };

/* When stderr is a file (a device's server.log under /run, a tmpfs: RAM)
 * past LOG_LIMIT_FILE_BYTES, empties it and says so: the lines a client
 * causes come at most LOG_LIMIT_LINES a window, but for as long as the
 * server runs.  The latest lines are the ones worth keeping.  Under the
 * lock.
 */
static void
bound_file_locked (void)
{
  struct stat st;

  if (fstat (STDERR_FILENO, &st) == -1 || !S_ISREG (st.st_mode) ||
      st.st_size < LOG_LIMIT_FILE_BYTES)
    return;
  fflush (stderr);
  if (ftruncate (STDERR_FILENO, 0) == -1)
    return;
  /* Opened for appending (as mloop opens it), the next line goes at
   * its start; else past a hole, which takes no room either.
   */
  fprintf (stderr, "mloop-server: the log reached %d bytes: the lines "
           "before were dropped\n", LOG_LIMIT_FILE_BYTES);
}

/* Says how many lines were dropped.  Called under the lock. */
static void
report_locked (void)
{
  if (lim.suppressed == 0)
    return;
  bound_file_locked ();
  fprintf (stderr, "mloop-server: %lu similar log line(s) suppressed "
           "(at most %d lines every %d s)\n", lim.suppressed,
           LOG_LIMIT_LINES, LOG_LIMIT_INTERVAL_S);
  lim.suppressed = 0;
}

/* Starts a new window once the current one is over.  Under the lock. */
static void
roll_window_locked (int64_t now)
{
  if (now - lim.window_start_ms >= LOG_LIMIT_INTERVAL_S * 1000) {
    lim.window_start_ms = now;
    lim.lines = 0;
  }
}

void
log_limited (const char *fmt, ...)
{
  va_list ap;

  pthread_mutex_lock (&lim.lock);
  roll_window_locked (server_now_ms ());
  if (lim.lines >= LOG_LIMIT_LINES) {
    lim.suppressed++;
    pthread_mutex_unlock (&lim.lock);
    return;
  }
  lim.lines++;
  report_locked ();
  bound_file_locked ();
  fputs ("mloop-server: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  pthread_mutex_unlock (&lim.lock);
}

int
log_limit_due_ms (void)
{
  int64_t left = -1;

  pthread_mutex_lock (&lim.lock);
  if (lim.suppressed) {
    left = lim.window_start_ms + LOG_LIMIT_INTERVAL_S * 1000 - server_now_ms ();
    if (left < 0)
      left = 0;
  }
  pthread_mutex_unlock (&lim.lock);
  return (int) left;
}

void
log_limit_report (int final)
{
  pthread_mutex_lock (&lim.lock);
  roll_window_locked (server_now_ms ());
  if (final || lim.lines == 0)
    report_locked ();
  pthread_mutex_unlock (&lim.lock);
}
