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

/* Whether NAME in the directory DIRFD is the file open as FD: the
 * entry itself, as unlinkat() acts on it, so a symbolic link there to
 * that file is not.
 */
bool mloop_names_file_at (int dirfd, const char *name, int fd);

/* Opens with FLAGS the file LOOKED_UP holds (an O_PATH descriptor of
 * PATH, relative to DIRFD), through /proc/self/fd: the file whose type
 * was checked, whatever PATH names by now.  Without /proc, PATH again.
 * -1 with errno from the open.
 */
int mloop_open_looked_up (int looked_up, int dirfd, const char *path,
                          int flags);

/* Opens PATH (relative to DIRFD, as openat) with FLAGS only when it is a
 * regular file: for anything else -1 with errno EINVAL and
 * *NOT_REGULAR set, without opening it, since opening is itself an act
 * for a device node or a FIFO.  What PATH names is looked up once
 * (O_PATH, which opens nothing) and that file opened through
 * /proc/self/fd, so a path changed after the check (a symlink, a
 * directory on it swapped) changes nothing; without /proc, by the path
 * again.  Otherwise -1 with errno from the open.
 */
int mloop_open_regular (int dirfd, const char *path, int flags,
                        bool *not_regular);

/* Locks the file open as FD, without waiting: shared, or EXCLUSIVE.
 * Shared is mloop's byte, the last of the offset range, and QEMU's
 * byte for refusing its "write" permission to others (201): a QEMU
 * writer is refused, qemu-img info and map are not.  Exclusive is the
 * whole file: it meets mloop's shared locks and every QEMU process
 * with the file open (each holds byte 100 at least), and keeps QEMU
 * from opening it meanwhile.  An open file description lock
 * (F_OFD_SETLK): held by the descriptor and its copies (a fork's as
 * well) until the last of them closes, like flock(), but an exclusive
 * one needs FD open for writing, so a process that may only read the
 * file cannot keep others' shared locks off it.  0, or a negative errno
 * (-EAGAIN: a conflicting lock is held).
 */
int mloop_lock_image (int fd, bool exclusive);

#endif /* MLOOP_FILEIO_H */
