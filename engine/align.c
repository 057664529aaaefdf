/* mloop — alignment helpers for O_DIRECT. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "align.h"

/* A mapping of COUNT bytes (rounded up to pages) starting at a multiple
 * of ALIGNMENT: map more, then unmap what sticks out at either end.
 */
static void *
map_aligned (size_t count, size_t alignment, size_t page)
{
  size_t len = mloop_round_up (count, page);
  size_t extra = alignment > page ? alignment : 0;
  char *base = mmap (NULL, len + extra, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  char *p;

  if (base == MAP_FAILED)
    return NULL;
  p = (char *) mloop_round_up ((uintptr_t) base, alignment);
  if (p > base)
    munmap (base, (size_t) (p - base));
  if (base + len + extra > p + len)
    munmap (p + len, (size_t) (base + len + extra - (p + len)));
  return p;
}

void *
mloop_alloc_aligned (size_t count, size_t alignment)
{
  size_t page = (size_t) sysconf (_SC_PAGESIZE);
  void *p = NULL;
  int r;

  if (alignment < page)
    alignment = page;
  if (count > MLOOP_KEEP_BUFFER)
    return map_aligned (count, alignment, page);
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

void
mloop_free_aligned (void *p, size_t count)
{
  if (p == NULL)
    return;
  if (count > MLOOP_KEEP_BUFFER)
    munmap (p, mloop_round_up (count, (size_t) sysconf (_SC_PAGESIZE)));
  else
    free (p);
}
