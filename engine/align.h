/* mloop — alignment helpers for O_DIRECT.
 *
 * O_DIRECT demands that the file offset, the length and the memory address
 * of every transfer be multiples of the backing store's logical block size.
 * These helpers answer "is this request directly servable?" and allocate
 * buffers that are.  All alignments are powers of two.
 */
#ifndef MLOOP_ALIGN_H
#define MLOOP_ALIGN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool
mloop_is_power_of_two (uint64_t v)
{
  return v != 0 && (v & (v - 1)) == 0;
}

static inline bool
mloop_is_aligned (uint64_t v, uint64_t alignment)
{
  return (v & (alignment - 1)) == 0;
}

static inline uint64_t
mloop_round_down (uint64_t v, uint64_t alignment)
{
  return v & ~(alignment - 1);
}

static inline uint64_t
mloop_round_up (uint64_t v, uint64_t alignment)
{
  return mloop_round_down (v + alignment - 1, alignment);
}

/* True when a transfer of COUNT bytes at OFFSET can be done on an
 * O_DIRECT descriptor requiring ALIGNMENT, given its memory address BUF.
 * ALIGNMENT == 1 means "no constraint" (buffered IO).
 */
static inline bool
mloop_io_is_direct_safe (const void *buf, size_t count, uint64_t offset,
                         uint32_t alignment)
{
  return mloop_is_aligned (offset, alignment)
    && mloop_is_aligned (count, alignment)
    && mloop_is_aligned ((uintptr_t) buf, alignment);
}

/* Request buffers up to this size are worth keeping for the next
 * request (a typical request is 4 KiB to 1 MiB); larger ones are given
 * back to the kernel as soon as their request is done, so a burst of
 * 64 MiB requests does not leave the server that much bigger for good.
 */
#define MLOOP_KEEP_BUFFER (1u << 20)

/* Allocates COUNT bytes aligned to ALIGNMENT (at least the page size,
 * so the buffer suits any block size up to 4096).  Returns NULL with
 * errno set on failure.  Free with mloop_free_aligned (P, COUNT).
 *
 * Above MLOOP_KEEP_BUFFER the memory is a private mapping of its own,
 * unmapped when freed: malloc would keep such a block in its heap (glibc
 * raises its mmap threshold after each large free, up to 32 MiB), which
 * would let a few large requests pin their size in RSS for good.
 */
void *mloop_alloc_aligned (size_t count, size_t alignment);
void mloop_free_aligned (void *p, size_t count);

#endif /* MLOOP_ALIGN_H */
