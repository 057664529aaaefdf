/* mloop — how `mloop list` and `mloop status` print, as a table or JSON. */
#ifndef MLOOP_CLIENT_PRINT_H
#define MLOOP_CLIENT_PRINT_H

#include <stdbool.h>
#include <stdio.h>

#include "device_state.h"
#include "device_status.h"

void mloop_print_list (FILE *f, const struct mloop_device_state *list,
                       size_t n, bool json);
void mloop_print_status (FILE *f, const struct mloop_device_state *s,
                         const struct mloop_device_status *st, bool json);

#endif /* MLOOP_CLIENT_PRINT_H */
