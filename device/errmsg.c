/* mloop — the library's one way to report an error. */
#include <stdarg.h>
#include <stdio.h>

#include "errmsg.h"

int
mloop_fail (char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  if (err == NULL || errlen == 0)
    return -1;
  va_start (ap, fmt);
  vsnprintf (err, errlen, fmt, ap);
  va_end (ap);
  return -1;
}
