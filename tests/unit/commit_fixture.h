/* The unit tests of a commit that merged but could not remove its
 * overlay: how they make one (device/overlay_file.c's commit).
 */
#ifndef MLOOP_TESTS_COMMIT_FIXTURE_H
#define MLOOP_TESTS_COMMIT_FIXTURE_H

#include <stddef.h>

/* Commits the overlay at PATH with its directory DIR append-only (as
 * root, with chattr; skips the test without), so the merge runs and the
 * removal fails; ERR gets the commit's message.  Fails the test unless
 * the commit failed and left the overlay.
 */
void unit_commit_unremoved (const char *path, const char *dir, char *err,
                            size_t errlen);

#endif
