/* A unit test's say in fsync(2) and fdatasync(2).
 *
 * The engine and device libraries are linked into the test statically,
 * so the fsync and fdatasync this file defines are the ones they call
 * (the C library's stand aside).  Each calls the test's hook when it
 * has set one, else the system call: the hook sees every sync of every
 * descriptor, and fails one (as the kernel's report of a lost
 * writeback) or notes it, calling unit_sync_really to sync.
 */
#ifndef MLOOP_TESTS_SYNC_HOOK_H
#define MLOOP_TESTS_SYNC_HOOK_H

#include <sys/syscall.h>

/* FD's sync, CALL being SYS_fsync or SYS_fdatasync: 0, or -1 with
 * errno.  Set before the first sync the test cares about.
 */
extern int (*unit_sync_hook) (int fd, long call);

/* The sync itself (the system call CALL). */
int unit_sync_really (int fd, long call);

#endif /* MLOOP_TESTS_SYNC_HOOK_H */
