/* What the lookup unit tests share: device states made up in a private
 * runtime directory, and a lookup as the command line does it.
 */
#ifndef MLOOP_TESTS_LOOKUP_FIXTURE_H
#define MLOOP_TESTS_LOOKUP_FIXTURE_H

#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/* A device's state, /dev/nbdINDEX serving FILE (identity ST) for OWNER,
 * in the runtime directory: HELD, an image its caller opened (then
 * FILE is a held: name), READ_ONLY.  Its directory (g_free it).
 */
char *unit_make_device (int index, const char *file, const struct stat *st,
                        uid_t owner, bool held, bool read_only);

/* Looks WHAT up as the CLI does (mloop_lookup), expecting device INDEX. */
void unit_expect_lookup (const char *what, int index);

#endif /* MLOOP_TESTS_LOOKUP_FIXTURE_H */
