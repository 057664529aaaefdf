/* What the unit tests share: failing with a message, skipping, and
 * removing their temporary files however the test ends.
 *
 * A test that fails calls unit_fail() (through CHECK), which exits 1;
 * one that cannot run here calls unit_skip(), which exits 77 (meson's
 * skip).  Either way, and on SIGABRT (a failed assert in the code under
 * test), SIGSEGV and SIGBUS (a crash there), SIGALRM (unit_deadline),
 * SIGTERM and SIGINT (meson's timeout, ^C), the paths given to
 * unit_remove_at_exit() are removed first.
 */
#ifndef MLOOP_TESTS_UNIT_H
#define MLOOP_TESTS_UNIT_H

#include <stdnoreturn.h>

#define CHECK(cond, ...)                                                \
  do {                                                                  \
    if (!(cond))                                                        \
      unit_fail (__FILE__, __LINE__, #cond, __VA_ARGS__);               \
  } while (0)

noreturn void unit_fail (const char *file, int line, const char *cond,
                         const char *fmt, ...)
  __attribute__ ((format (printf, 4, 5)));
noreturn void unit_skip (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Removes PATH (a file, or a directory and all in it) when the test
 * exits.  Paths are removed most recent first.  PATH is copied.
 */
void unit_remove_at_exit (const char *path);

/* A new private directory under BASE, removed at exit.  The name is
 * valid until then.
 */
const char *unit_tmpdir (const char *base);

/* Makes PATH, a new file of SIZE zero bytes (an image a test serves,
 * overlays or commits into); fails the test if it cannot or if PATH
 * exists already.
 */
void unit_make_image (const char *path, unsigned long long size);

void unit_sleep_ms (unsigned ms);

/* Fails the test (SIGALRM) if it still runs SECONDS from now: a lock
 * that never wakes a waiter must fail, not hang until meson's timeout.
 */
void unit_deadline (unsigned seconds);

#endif /* MLOOP_TESTS_UNIT_H */
