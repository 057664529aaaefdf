/* mloop-ublk --delete N: take away a ublk device its server left behind. */
#ifndef MLOOP_UBLK_DELETE_H
#define MLOOP_UBLK_DELETE_H

#include <stdbool.h>
#include <stddef.h>

/* Stops ublk device ID if it still has a disk, and deletes it.  0 when
 * it is gone (also when there was no such device), or -1 with a
 * one-line reason in ERR. */
int ublk_delete_device (unsigned id, bool legacy, char *err, size_t errlen);

#endif
