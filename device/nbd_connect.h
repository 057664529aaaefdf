/* mloop — opening negotiated connections to an export on a Unix socket,
 * ready to hand to the kernel (attach, and reconnect after a restart).
 * Never prints.
 */
#ifndef MLOOP_NBD_CONNECT_H
#define MLOOP_NBD_CONNECT_H

#include <stdbool.h>
#include <stddef.h>

#include "address.h"
#include "nbd_client.h"

/* Opens and negotiates up to N connections to A into FDS; *X is the
 * export as the first connection saw it.  If the export does not
 * advertise multi-conn only one is opened, or, when STRICT, that is an
 * error.  Every connection must see the same export.  Returns how many
 * were opened, or -1 with every descriptor closed (FDS all -1).
 */
int mloop_nbd_connect (const struct mloop_nbd_address *a, unsigned n,
                       bool strict, int *fds, struct mloop_nbd_export *x,
                       char *err, size_t errlen);

/* The local case: N connections to the default export on SOCKET_PATH,
 * multi-conn required when N > 1.  0 or -1.
 */
int mloop_nbd_connect_unix (const char *socket_path, unsigned n, int *fds,
                            struct mloop_nbd_export *x, char *err,
                            size_t errlen);

/* Closes the N descriptors in FDS that are open, setting them to -1. */
void mloop_nbd_close_all (int *fds, unsigned n);

#endif /* MLOOP_NBD_CONNECT_H */
