/* mloop — whole-buffer positional IO on a file: what the overlay and the
 * unaligned path share.
 */
#ifndef MLOOP_FILEIO_H
#define MLOOP_FILEIO_H

#include <stdbool.h>
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

/* Opens the directory holding PATH (O_RDONLY, so that it can be
 * synced) and sets *NAME (to free) to PATH's last component, for the
 * *at() calls that must act on the entry found there whatever a
 * directory on PATH becomes later (swapped for a symlink by whoever may
 * write its parent).  The descriptor, or -1 with errno.
 */
int mloop_open_parent (const char *path, char **name);

/* Whether NAME in the directory DIRFD names the file open as FD,
 * following a symlink there as open() would.
 */
bool mloop_names_file_at (int dirfd, const char *name, int fd);

#endif /* MLOOP_FILEIO_H */
