/* mloop — requests not aligned to the logical block size, on O_DIRECT.
 *
 * Served synchronously on the submitting thread (they are rare: clients
 * that honour the advertised minimum block size never send them):
 *   read:  read the covering aligned range into an aligned buffer, copy
 *          out the requested bytes;
 *   write: lock the covering range, read the partial head and tail
 *          blocks, merge the new bytes, write the covering range back.
 * Everything stays on the O_DIRECT descriptor.  A buffered descriptor
 * would be simpler but is unsafe: a buffered partial write and a
 * concurrent direct write to another block of the same page can leave a
 * dirty page holding the other block's old data, to be written back over
 * it later (the kernel's "Page cache invalidation failure on direct I/O").
 */
#ifndef MLOOP_UNALIGNED_H
#define MLOOP_UNALIGNED_H

#include "io.h"

struct mloop_engine;

/* Performs IO; returns 0 or a negative errno.  Does not complete IO. */
int mloop_unaligned_rw (struct mloop_engine *e, struct mloop_io *io);

#endif /* MLOOP_UNALIGNED_H */
