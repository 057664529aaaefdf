/* mloop — alignment helpers for O_DIRECT. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "align.h"

void *
mloop_alloc_aligned (size_t count, size_t alignment)
{
  size_t page = (size_t) sysconf (_SC_PAGESIZE);
  void *p = NULL;
  int r;

  if (alignment < page)
    alignment = page;
  /* posix_memalign rejects a zero size on some libcs; a 0-byte request
   * still needs a valid pointer to pass to the kernel.
   */
  r = posix_memalign (&p, alignment, count ? count : alignment);
  if (r != 0) {
    errno = r;
    return NULL;
  }
  return p;
}
