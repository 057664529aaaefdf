/* mloop-supervisor — its log lines. */
#include <stdarg.h>
#include <stdio.h>

#include "say.h"

void
say (const char *fmt, ...)
{
  g_autoptr (GDateTime) now = g_date_time_new_now_local ();
  g_autofree char *stamp = g_date_time_format (now, "%F %T");
  va_list ap;

  fprintf (stderr, "mloop-supervisor: %s: ", stamp);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
}
