/* What every fuzz target uses to judge the server's answers. */
#ifndef MLOOP_FUZZ_CHECK_H
#define MLOOP_FUZZ_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* A protocol rule the server must keep: breaking one is a finding, so
 * abort and let the fuzzer save the input.
 */
#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf (stderr, "%s:%d: rule broken: %s\n",                      \
               __FILE__, __LINE__, #cond);                              \
      abort ();                                                         \
    }                                                                   \
  } while (0)

/* The N-byte big-endian number at P (wire fields, at any alignment). */
static inline uint64_t
get_be (const uint8_t *p, int n)
{
  uint64_t v = 0;

  while (n-- > 0)
    v = (v << 8) | *p++;
  return v;
}

#endif /* MLOOP_FUZZ_CHECK_H */
