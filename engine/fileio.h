/* mloop — whole-buffer positional IO on a file: what the overlay and the
 * unaligned path share.
 */
#ifndef MLOOP_FILEIO_H
#define MLOOP_FILEIO_H

#include <stddef.h>
#include <stdint.h>

/* Reads COUNT bytes at POS; a read that meets the end of the file fills
 * the rest with zeroes.  0 or a negative errno.
 */
int mloop_pread_or_zero (int fd, void *buf, size_t count, uint64_t pos);

/* Writes all of BUF at POS with pwritev2's RW_FLAGS (RWF_DSYNC for FUA).
 * 0 or a negative errno (-EIO when the file takes nothing).
 */
int mloop_pwrite_all (int fd, const void *buf, size_t count, uint64_t pos,
                      int rw_flags);

#endif /* MLOOP_FILEIO_H */
