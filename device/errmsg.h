/* mloop — the device library's one way to report an error.
 *
 * A function fails by returning -1 (NULL for a pointer) with a one-line
 * message in (ERR, ERRLEN), its last arguments, written by mloop_fail.
 * Those whose failure needs no reason (a lookup that finds nothing) take
 * no ERR.  The library never prints and never exits: its callers (mloop,
 * the supervisor) decide what the user sees.
 */
#ifndef MLOOP_ERRMSG_H
#define MLOOP_ERRMSG_H

#include <stddef.h>

/* Formats the message into ERR (if ERR and ERRLEN allow) and returns -1,
 * so a failing path can `return mloop_fail (err, errlen, ...);`.
 */
int mloop_fail (char *err, size_t errlen, const char *fmt, ...)
  __attribute__((format (printf, 3, 4)));

#endif /* MLOOP_ERRMSG_H */
