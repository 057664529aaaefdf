/* mloop — requests the AIO fast path cannot take, done synchronously.
 *
 * Two kinds, both rare (clients honouring the advertised minimum block
 * size send no unaligned request, and only odd-sized images have a tail):
 *   - unaligned offset or length: on the O_DIRECT descriptor.  A read
 *     reads the covering aligned range and copies out the bytes asked
 *     for; a write locks the covering range, reads its partial head and
 *     tail blocks, merges the new bytes and writes the range back.
 *   - bytes in the page-cache tail (backing.h, buffered_from): on the
 *     buffered descriptor, at any alignment.
 * A request crossing into the tail is split there.  No page of the image
 * is ever reached through both descriptors: a buffered write and a
 * concurrent direct write to one page can leave a dirty page the direct
 * write fails to invalidate, and the kernel then reports EIO to the next
 * fdatasync ("Page cache invalidation failure on direct I/O").
 */
#ifndef MLOOP_UNALIGNED_H
#define MLOOP_UNALIGNED_H

#include "io.h"

struct mloop_file_store;

/* Performs IO; returns 0 or a negative errno.  Does not complete IO. */
int mloop_sync_rw (struct mloop_file_store *e, struct mloop_io *io);

#endif /* MLOOP_UNALIGNED_H */
