/* mloop-supervisor — its log lines. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "say.h"

void
say_to (FILE *log, const char *fmt, ...)
{
  g_autoptr (GDateTime) now = g_date_time_new_now_local ();
  g_autofree char *stamp = g_date_time_format (now, "%F %T");
  va_list ap;

  /* The program's name (mloop-supervisor, mloopd), from its argv[0]. */
  fprintf (log, "%s: %s: ", g_get_prgname () ? g_get_prgname ()
           : "mloop-supervisor", stamp);
  va_start (ap, fmt);
  vfprintf (log, fmt, ap);
  va_end (ap);
  fputc ('\n', log);
  fflush (log);
}

char *
describe_exit (int status)
{
  if (WIFSIGNALED (status))
    return g_strdup_printf ("killed by signal %d (%s)", WTERMSIG (status),
                            strsignal (WTERMSIG (status)));
  return g_strdup_printf ("exited with status %d", WEXITSTATUS (status));
}
