/* mloop-server — one bound on every log line a client can repeat (see
 * log_limit.h).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "clock.h"
#include "log_limit.h"

static struct {
  pthread_mutex_t lock;
  int64_t window_start_ms;      /* when the current window began */
  unsigned lines;               /* written in it */
  unsigned long suppressed;     /* dropped since the last report */
} lim = { .lock = PTHREAD_MUTEX_INITIALIZER, .window_start_ms = INT64_MIN / 2 };

/* Says how many lines were dropped.  Called under the lock. */
static void
report_locked (void)
{
  if (lim.suppressed == 0)
    return;
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
