/* mloop — opening negotiated connections to an export on a Unix socket,
 * ready to hand to the kernel (attach, and reconnect after a restart).
 * Never prints.
 */
#ifndef MLOOP_NBD_CONNECT_H
#define MLOOP_NBD_CONNECT_H

#include <stddef.h>

#include "nbd_client.h"

/* Opens and negotiates N connections to SOCKET_PATH into FDS.  More than
 * one only if the export advertises multi-conn; every connection must see
 * the same export.  *X is the export as the first connection saw it.  On
 * failure returns -1 and closes every descriptor it opened (FDS all -1).
 */
int mloop_nbd_connect_unix (const char *socket_path, unsigned n, int *fds,
                            struct mloop_nbd_export *x, char *err,
                            size_t errlen);

/* Closes the N descriptors in FDS that are open, setting them to -1. */
void mloop_nbd_close_all (int *fds, unsigned n);

#endif /* MLOOP_NBD_CONNECT_H */
