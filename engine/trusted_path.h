/* mloop — whether a path only trusted users can redirect.
 *
 * A file root opens again later by name (a Ceph configuration each of a
 * device's servers reads when it starts) is judged as opened each time,
 * but the name can lead elsewhere by then: whoever may rename entries in
 * a directory on the way, or owns a symbolic link followed there, can
 * swap what the name reaches for another file that passes the same
 * judgement.  OpenSSH's StrictModes asks the same of a user's files.
 * `mloop attach` walks the path before recording it, and each server
 * walks it again before reading it, since an entry can change hands
 * between the two (a directory of root's in /tmp removed by a cleaner,
 * then made again by a user).  libc only: the store module and the
 * device library both build it.
 */
#ifndef MLOOP_TRUSTED_PATH_H
#define MLOOP_TRUSTED_PATH_H

#include <stdbool.h>
#include <stddef.h>

/* Whether absolute PATH, resolved as the kernel would, passes only
 * through entries root or this process's user owns (every directory,
 * symbolic link and the file itself), in directories no one else may
 * write, or only sticky (others keep to their own entries there).
 * Else false with WHY (one line naming the entry and what is wrong),
 * as when PATH cannot be resolved.
 */
bool mloop_path_trusted (const char *path, char *why, size_t whylen);

#endif /* MLOOP_TRUSTED_PATH_H */
