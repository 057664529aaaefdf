/* mloop — parsing the values of options every front end shares. */
#include <errno.h>
#include <stdint.h>

#include "parse.h"

int
mloop_size_parse (const char *str, uint64_t *out)
{
  uint64_t n = 0, scale = 1;
  const char *p = str;

  if (*p < '0' || *p > '9')
    return -EINVAL;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (n > (UINT64_MAX - (uint64_t) (*p - '0')) / 10)
      return -ERANGE;
    n = n * 10 + (uint64_t) (*p - '0');
  }
  switch (*p) {
  case 'k': case 'K': scale = 1ull << 10; p++; break;
  case 'm': case 'M': scale = 1ull << 20; p++; break;
  case 'g': case 'G': scale = 1ull << 30; p++; break;
  case 't': case 'T': scale = 1ull << 40; p++; break;
  }
  if (*p != '\0')
    return -EINVAL;
  if (n > UINT64_MAX / scale)
    return -ERANGE;
  *out = n * scale;
  return 0;
}
