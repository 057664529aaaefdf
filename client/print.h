/* mloop — how the mloop command prints its one-line errors (devices
 * are described by describe.h).
 */
#ifndef MLOOP_CLIENT_PRINT_H
#define MLOOP_CLIENT_PRINT_H

#include <stdio.h>

#include <glib.h>

/* "mloop: MESSAGE" on stderr, one line, its control and bidi characters
 * escaped (printable.h); returns EXIT_FAILURE.
 */
int mloop_print_error (const char *fmt, ...) G_GNUC_PRINTF (1, 2);

#endif /* MLOOP_CLIENT_PRINT_H */
