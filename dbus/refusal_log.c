/* mloop-dbus — the lines a user's refused calls write to the log
 * (refusal_log.h).
 */
#include <stdarg.h>
#include <stdbool.h>

#include <glib.h>

#include "refusal_log.h"

/* One user's lines in the current window. */
struct budget {
  gint64 start_us;              /* the window's start, monotonic */
  unsigned lines;               /* logged in it */
  unsigned dropped;             /* not logged since the last count said */
  bool timer;                   /* a count is due at the window's end */
};

static GMutex lock;
static GHashTable *budgets;     /* uid -> struct budget */

/* Under LOCK: says how many of UID's refusals B did not log. */
static void
say_dropped (uid_t uid, struct budget *b)
{
  if (b->dropped == 0)
    return;
  g_message ("uid %u: %u more refused calls not logged (at most %d in "
             "%d s per user)", (unsigned) uid, b->dropped,
             MLOOP_REFUSAL_LOG_LINES, MLOOP_REFUSAL_LOG_WINDOW_S);
  b->dropped = 0;
}

/* At the end of a window in which a user's refusals were dropped. */
static gboolean
window_over (gpointer data)
{
  uid_t uid = (uid_t) GPOINTER_TO_UINT (data);
  struct budget *b;

  g_mutex_lock (&lock);
  b = g_hash_table_lookup (budgets, data);
  b->timer = false;
  say_dropped (uid, b);
  g_mutex_unlock (&lock);
  return G_SOURCE_REMOVE;
}

/* Under LOCK: UID's budget, its window started afresh if it is over. */
static struct budget *
budget_now (uid_t uid, gint64 now)
{
  gpointer key = GUINT_TO_POINTER ((guint) uid);
  struct budget *b;

  if (budgets == NULL)
    budgets = g_hash_table_new_full (NULL, NULL, NULL, g_free);
  b = g_hash_table_lookup (budgets, key);
  if (b == NULL) {
    b = g_new0 (struct budget, 1);
    b->start_us = now;
    g_hash_table_insert (budgets, key, b);
  }
  if (now - b->start_us >= MLOOP_REFUSAL_LOG_WINDOW_S * G_USEC_PER_SEC) {
    say_dropped (uid, b);
    b->start_us = now;
    b->lines = 0;
  }
  return b;
}

void
mloop_refusal_log (uid_t uid, const char *fmt, ...)
{
  gint64 now = g_get_monotonic_time ();
  struct budget *b;
  va_list ap;

  if (uid != 0) {
    g_mutex_lock (&lock);
    b = budget_now (uid, now);
    if (b->lines >= MLOOP_REFUSAL_LOG_LINES) {
      b->dropped++;
      if (!b->timer) {
        gint64 left_us = b->start_us +
          MLOOP_REFUSAL_LOG_WINDOW_S * G_USEC_PER_SEC - now;

        b->timer = true;
        g_timeout_add ((guint) (left_us / 1000) + 1, window_over,
                       GUINT_TO_POINTER ((guint) uid));
      }
      g_mutex_unlock (&lock);
      return;
    }
    b->lines++;
    g_mutex_unlock (&lock);
  }
  va_start (ap, fmt);
  g_logv (G_LOG_DOMAIN, G_LOG_LEVEL_MESSAGE, fmt, ap);
  va_end (ap);
}

void
mloop_refusal_log_flush (void)
{
  GHashTableIter iter;
  gpointer key, value;

  g_mutex_lock (&lock);
  if (budgets) {
    g_hash_table_iter_init (&iter, budgets);
    while (g_hash_table_iter_next (&iter, &key, &value))
      say_dropped ((uid_t) GPOINTER_TO_UINT (key), value);
  }
  g_mutex_unlock (&lock);
}
