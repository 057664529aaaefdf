/* mloop — the mloop command's one-line errors. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "print.h"

int
mloop_print_error (const char *fmt, ...)
{
  va_list ap;

  fputs ("mloop: ", stderr);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  return EXIT_FAILURE;
}
