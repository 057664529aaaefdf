/* mloop — how the mloop command prints: list and status as a table or
 * JSON, and its one-line errors. */
#ifndef MLOOP_CLIENT_PRINT_H
#define MLOOP_CLIENT_PRINT_H

#include <stdbool.h>
#include <stdio.h>

#include <glib.h>

#include "device_state.h"
#include "device_status.h"

/* "mloop: MESSAGE" on stderr, one line; returns EXIT_FAILURE. */
int mloop_print_error (const char *fmt, ...) G_GNUC_PRINTF (1, 2);

void mloop_print_list (FILE *f, const struct mloop_device_state *list,
                       size_t n, bool json);
void mloop_print_status (FILE *f, const struct mloop_device_state *s,
                         const struct mloop_device_status *st, bool json);

#endif /* MLOOP_CLIENT_PRINT_H */
