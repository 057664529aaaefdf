/* mloop — whether the owner of one file may write another: the check
 * `mloop overlay commit` makes before writing an overlay's clusters into
 * a base the overlay's header names (design.md, "Commit and discard").
 */
#ifndef MLOOP_OWNER_ACCESS_H
#define MLOOP_OWNER_ACCESS_H

#include <stddef.h>

/* Whether the user owning the open file OWNED_FD may write the open
 * file TARGET_FD, found at TARGET_PATH, by the kernel's own check
 * with that user's ids, groups included: that user must reach it
 * there (search permission on every directory on the path, which holds
 * no symbolic link) and may write it.  1 yes, 0 no (with the user's
 * name, or uid, in USER), or a negative errno when it cannot be told (a
 * caller that may not take those ids, no /proc, the path naming another
 * file now) with a one-line reason in ERR.  The owner root, or the
 * caller itself, may: the caller's own open already checked.
 */
int mloop_owner_may_write (int owned_fd, int target_fd,
                           const char *target_path, char *user,
                           size_t userlen, char *err, size_t errlen);

#endif
