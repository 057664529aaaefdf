/* mloop — how devices are described: `mloop list` and `mloop status`
 * as a table or JSON, written to a stream the caller gives.
 */
#ifndef MLOOP_DESCRIBE_H
#define MLOOP_DESCRIBE_H

#include <stdbool.h>
#include <stdio.h>

#include "device_state.h"
#include "device_status.h"

void mloop_describe_list (FILE *f, const struct mloop_device_state *list,
                          size_t n, bool json);
void mloop_describe_status (FILE *f, const struct mloop_device_state *s,
                            const struct mloop_device_status *st, bool json);

#endif /* MLOOP_DESCRIBE_H */
