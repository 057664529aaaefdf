/* mloop — entries of the user and group databases, however large.
 *
 * getpwuid_r and its kin answer ERANGE when the caller's buffer is too
 * small for an entry's strings, and an entry may be large (a long GECOS
 * field, a group with thousands of members, a directory service's
 * attributes) and still be its user's: a lookup that gave up would take
 * a user for unknown, and a group for none.  These grow the buffer from
 * a first guess up to MLOOP_USER_DB_ENTRY_MAX.
 */
#ifndef MLOOP_USER_DB_H
#define MLOOP_USER_DB_H

#include <grp.h>
#include <pwd.h>
#include <sys/types.h>

/* The most an entry's strings may take. */
#define MLOOP_USER_DB_ENTRY_MAX (1u << 20)

/* The entry into *PW or *GR, its strings in *BUF, a block the caller
 * frees (free or g_free) whatever the outcome; *BUF may hold a block
 * already, which is reused.  0, or -1 with errno: ENOENT when there is
 * no such entry, ERANGE when it is larger than the most, or the
 * lookup's own error.
 */
int mloop_user_by_uid (uid_t uid, struct passwd *pw, char **buf);
int mloop_user_by_name (const char *name, struct passwd *pw, char **buf);
int mloop_group_by_name (const char *name, struct group *gr, char **buf);

#endif /* MLOOP_USER_DB_H */
