/* Unit tests for the O_DIRECT alignment helpers. */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "align.h"

int
main (void)
{
  char *p;

  assert (mloop_is_power_of_two (1));
  assert (mloop_is_power_of_two (512));
  assert (mloop_is_power_of_two (UINT64_C (1) << 63));
  assert (!mloop_is_power_of_two (0));
  assert (!mloop_is_power_of_two (768));

  assert (mloop_is_aligned (0, 512));
  assert (mloop_is_aligned (4096, 512));
  assert (!mloop_is_aligned (4097, 512));
  assert (mloop_is_aligned (12345, 1));

  assert (mloop_round_down (4097, 4096) == 4096);
  assert (mloop_round_down (4095, 4096) == 0);
  assert (mloop_round_up (4097, 4096) == 8192);
  assert (mloop_round_up (4096, 4096) == 4096);
  assert (mloop_round_up (0, 512) == 0);

  p = mloop_alloc_aligned (10000, 512);
  assert (p != NULL);
  /* At least page-aligned, whatever was asked. */
  assert (mloop_is_aligned ((uintptr_t) p, 4096));
  assert (mloop_io_is_direct_safe (p, 4096, 8192, 512));
  assert (!mloop_io_is_direct_safe (p + 16, 4096, 8192, 512));  /* buffer */
  assert (!mloop_io_is_direct_safe (p, 4000, 8192, 512));       /* length */
  assert (!mloop_io_is_direct_safe (p, 4096, 8193, 512));       /* offset */
  assert (mloop_io_is_direct_safe (p + 1, 3, 7, 1));            /* buffered */
  mloop_free_aligned (p, 10000);

  /* Above the keep size: a mapping of its own, aligned even to more
   * than a page, every byte usable, unmapped by mloop_free_aligned.
   */
  p = mloop_alloc_aligned (MLOOP_KEEP_BUFFER + 1000, 65536);
  assert (p != NULL);
  assert (mloop_is_aligned ((uintptr_t) p, 65536));
  memset (p, 0xa5, MLOOP_KEEP_BUFFER + 1000);
  mloop_free_aligned (p, MLOOP_KEEP_BUFFER + 1000);

  p = mloop_alloc_aligned (0, 4096);    /* zero bytes still gives a pointer */
  assert (p != NULL);
  mloop_free_aligned (p, 0);

  printf ("ok: alignment helpers\n");
  return 0;
}
