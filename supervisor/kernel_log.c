/* The kernel's reasons for dropped nbd connections (kernel_log.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include "kernel_log.h"

/* Kernel log lines older than this are not about the drop at hand. */
#define WINDOW_US (120 * G_USEC_PER_SEC)

static const struct { const char *says, *reason; } causes[] = {
  { "Connection timed out", "request timeout" },
  { "Send control failed", "send failed" },
  { "Send data failed", "send failed" },
  { "Request send failed", "send failed" },
  { "Receive control failed", "receive failed" },
};

/* What a device's lines said since its keeper last asked. */
struct said {
  size_t best;                  /* index into causes */
  char *line;
  gint64 at;                    /* the line's time (CLOCK_MONOTONIC) */
};

static int kmsg = -1;
static unsigned holds;
static GHashTable *said_by;     /* device index -> struct said */

static void
said_free (gpointer data)
{
  struct said *s = data;

  g_free (s->line);
  g_free (s);
}

void
kernel_log_hold (void)
{
  if (holds++ > 0)
    return;
  said_by = g_hash_table_new_full (NULL, NULL, NULL, said_free);
  kmsg = open ("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (kmsg != -1)
    lseek (kmsg, 0, SEEK_END);
}

void
kernel_log_release (void)
{
  if (holds == 0 || --holds > 0)
    return;
  if (kmsg != -1)
    close (kmsg);
  kmsg = -1;
  g_hash_table_destroy (said_by);
  said_by = NULL;
}

/* One record's TEXT at time AT, if it names an nbd device's cause. */
static void
note (const char *text, gint64 at)
{
  const char *p = strstr (text, "nbd");
  struct said *s;
  char *end;
  long index;

  if (p == NULL)
    return;
  index = strtol (p + 3, &end, 10);
  if (end == p + 3 || index < 0 || strncmp (end, ": ", 2) != 0)
    return;
  end += 2;
  for (size_t i = 0; i < G_N_ELEMENTS (causes); i++)
    if (g_str_has_prefix (end, causes[i].says)) {
      s = g_hash_table_lookup (said_by, GINT_TO_POINTER ((int) index));
      if (s == NULL) {
        s = g_new0 (struct said, 1);
        s->best = G_N_ELEMENTS (causes);
        g_hash_table_insert (said_by, GINT_TO_POINTER ((int) index), s);
      }
      if (i <= s->best || s->at < at - WINDOW_US) {
        /* The latest of the most telling; an old one gives way. */
        s->best = i;
        g_free (s->line);
        s->line = g_strdup (end);
        s->at = at;
      }
      return;
    }
}

/* Reads every record logged since the last read.  One record per read:
 * "PRIO,SEQ,USEC,FLAGS;TEXT\n" and continuation lines; EPIPE says
 * records were overwritten, and reading goes on.
 */
static void
read_new (void)
{
  gint64 oldest = g_get_monotonic_time () - WINDOW_US;
  char rec[8192];
  ssize_t n;

  while (kmsg != -1 &&
         ((n = read (kmsg, rec, sizeof rec - 1)) > 0 ||
          (n == -1 && (errno == EPIPE || errno == EINTR)))) {
    unsigned long long usec;
    char *text;

    if (n <= 0)
      continue;
    rec[n] = '\0';
    text = strchr (rec, ';');
    if (text == NULL || sscanf (rec, "%*u,%*u,%llu", &usec) != 1 ||
        (gint64) usec < oldest)
      continue;
    text[strcspn (text, "\n")] = '\0';
    note (text + 1, (gint64) usec);
  }
}

const char *
kernel_log_reason (int index, char **line)
{
  struct said *s;
  const char *reason = NULL;

  *line = NULL;
  if (said_by == NULL)
    return NULL;
  read_new ();
  s = g_hash_table_lookup (said_by, GINT_TO_POINTER (index));
  if (s && s->at >= g_get_monotonic_time () - WINDOW_US) {
    reason = causes[s->best].reason;
    *line = g_steal_pointer (&s->line);
  }
  g_hash_table_remove (said_by, GINT_TO_POINTER (index));
  return reason;
}
