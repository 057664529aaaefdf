/* mloop — what librbd's answer to a request says (rbd_store.c).
 *
 * librbd cuts a request crossing the image's end, as librbd sees the
 * size at that moment, down to the part that fits, and answers success.
 * The store checks each request against its own copy of the size, which
 * librbd's update watch refreshes only a little after librbd's own: in
 * between (a shrink made elsewhere, which this writable server's librbd
 * carries out as the lock's holder) a request the store let through is
 * cut.  Only the count of bytes in the answer tells: rbd_read,
 * rbd_write, rbd_write_zeroes and an asynchronous read answer the
 * bytes served, an asynchronous write answers 0, cut or not, so a cut
 * there cannot be seen.  The decision alone is here, to be tested
 * without a cluster.
 */
#ifndef MLOOP_RBD_ANSWER_H
#define MLOOP_RBD_ANSWER_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>

/* The errno for librbd's answer RES (a negative errno, or bytes when
 * COUNTS_BYTES) to a request of COUNT bytes, 0 for success.  Fewer
 * bytes than asked is EIO: the rest lies past the image's end, never
 * read, or never written though the call succeeded.
 */
static inline int
rbd_answer_error (long res, bool counts_bytes, size_t count)
{
  if (res < 0)
    return (int) -res;
  if (counts_bytes && (size_t) res != count)
    return EIO;
  return 0;
}

#endif
