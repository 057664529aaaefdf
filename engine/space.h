/* mloop — trim, zero and extents: managing the space behind the image.
 *
 * These map to fallocate(2), the block device ioctls and lseek(2)'s
 * SEEK_DATA/SEEK_HOLE, which have no AIO form, so they run synchronously
 * on the calling thread.  They are validated like reads and writes, and
 * never leave a partial block half-done: the aligned middle of a range
 * goes to the filesystem or device, and partial blocks at either end are
 * zeroed by read-modify-write under the engine's range lock.
 *
 * Ordering: a reply to a write is sent only after its AIO has completed,
 * so any write the client has seen acknowledged is on the file before a
 * later trim or zero starts; fallocate cannot be overtaken by it.  Writes
 * still in flight that overlap a trim or zero are the client's business
 * (the NBD spec leaves overlapping in-flight requests unordered).
 */
#ifndef MLOOP_SPACE_H
#define MLOOP_SPACE_H

#include <stdbool.h>
#include <stdint.h>

struct mloop_engine;

/* Flags for trim and zero (and MLOOP_IO_FUA from io.h). */
#define MLOOP_ZERO_NO_HOLE    (1u << 1)  /* keep the range allocated */
#define MLOOP_ZERO_FAST       (1u << 2)  /* fail with ENOTSUP, changing
                                          * nothing, rather than write zeroes */

/* Each returns 0 or a negative errno: EINVAL (trim past the end), ENOSPC
 * (zero past the end), EPERM (read-only store), ENOTSUP (fast zero not
 * possible), or the kernel's error.
 */
int mloop_engine_trim (struct mloop_engine *e, uint64_t offset,
                       uint64_t count, unsigned flags);
int mloop_engine_zero (struct mloop_engine *e, uint64_t offset,
                       uint64_t count, unsigned flags);

/* Reports the allocation of [offset, offset+count) as consecutive
 * extents through FN (HOLE: reads as zeroes, no storage).  Data is
 * reported wherever the filesystem cannot tell, so a hole is never
 * reported where data is.  With REQ_ONE, stops after the first extent.
 * Returns 0, FN's negative return, or a negative errno.
 */
typedef int (*mloop_extent_fn) (void *opaque, uint64_t offset,
                                uint64_t length, bool hole);
int mloop_engine_extents (struct mloop_engine *e, uint64_t offset,
                          uint64_t count, bool req_one, mloop_extent_fn fn,
                          void *opaque);

/* fallocate(2) of [offset, offset + count) of FD, retried on EINTR:
 * 0 or a negative errno.  For the engine's layers too.
 */
int mloop_fallocate (int fd, int mode, uint64_t offset, uint64_t count);

/* The allocation of [pos, end) of an open file whose byte 0 is at file
 * offset BASE, as mloop_engine_extents reports it (all data for a block
 * device): for the engine's layers, which report several files as one.
 */
int mloop_file_extents (int fd, uint64_t base, bool is_block_device,
                        uint64_t pos, uint64_t end, bool req_one,
                        mloop_extent_fn fn, void *opaque);

#endif /* MLOOP_SPACE_H */
