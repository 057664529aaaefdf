/* An LD_PRELOAD shim for test-rbd-conf-trust.py: on the first open of
 * $MLOOP_TEST_SWAP_AT, whatever its flags, root's directory
 * $MLOOP_TEST_SWAP_ROOTS goes aside (to $MLOOP_TEST_SWAP_ASIDE, as a
 * /tmp cleaner would remove it) and the user's $MLOOP_TEST_SWAP_USERS
 * takes its name, just before the open: the moment between a walk of
 * the path and an open of it by name.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static int swapped;

static void
swap_before (const char *path)
{
  const char *at = getenv ("MLOOP_TEST_SWAP_AT");

  if (swapped || at == NULL || strcmp (path, at) != 0)
    return;
  swapped = 1;
  if (rename (getenv ("MLOOP_TEST_SWAP_ROOTS"),
              getenv ("MLOOP_TEST_SWAP_ASIDE")) != 0 ||
      rename (getenv ("MLOOP_TEST_SWAP_USERS"),
              getenv ("MLOOP_TEST_SWAP_ROOTS")) != 0)
    perror ("swap_on_open");
}

static int
forward (const char *name, const char *path, int flags, va_list ap)
{
  int (*real) (const char *, int, ...) = dlsym (RTLD_NEXT, name);
  mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg (ap, mode_t) : 0;

  swap_before (path);
  return real (path, flags, mode);
}

int
open (const char *path, int flags, ...)
{
  va_list ap;
  int r;

  va_start (ap, flags);
  r = forward ("open", path, flags, ap);
  va_end (ap);
  return r;
}

int
open64 (const char *path, int flags, ...)
{
  va_list ap;
  int r;

  va_start (ap, flags);
  r = forward ("open64", path, flags, ap);
  va_end (ap);
  return r;
}
