/* mloop — the library's one way to report an error: a one-line message
 * in the caller's buffer, never printed.
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
