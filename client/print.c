/* mloop — the mloop command's one-line errors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "print.h"
#include "printable.h"

int
mloop_print_error (const char *fmt, ...)
{
  va_list ap;
  g_autofree char *text = NULL;
  g_autofree char *shown = NULL;

  va_start (ap, fmt);
  text = g_strdup_vprintf (fmt, ap);
  va_end (ap);
  /* A message may quote a name another user chose (the label of an
   * image attached through mloop's D-Bus service, in a refusal of
   * root's attach of the same file): its control and bidi characters
   * are escaped, as `mloop list` escapes them.
   */
  shown = mloop_printable (text);
  fprintf (stderr, "mloop: %s\n", shown);
  return EXIT_FAILURE;
}
