/* librbd's answer to a request, as the RBD store reads it
 * (engine/rbd_answer.h).  librbd cuts a request crossing the image's
 * end, as it sees the size, down to what fits and answers success with
 * the bytes it served; the store's own size lags librbd's for a moment
 * after a shrink made elsewhere, so such a request reaches librbd.  A
 * write, zero or trim answered with fewer bytes than asked was not done
 * whole and must fail with EIO, as a short read does; an asynchronous
 * write answers 0 whatever it wrote, and 0 is success.  (librbd 16.2,
 * measured on a 1 MiB image, 8 KiB at 1 MiB - 4 KiB: rbd_write and
 * rbd_write_zeroes answer 4096, rbd_aio_write's completion 0.)
 * Pure decision, no cluster: well under a millisecond, unit suite.
 */
#include <errno.h>
#include <stdbool.h>

#include "rbd_answer.h"
#include "unit.h"

int
main (void)
{
  int e;

  /* Bytes-counting calls: rbd_read, rbd_write, rbd_write_zeroes. */
  e = rbd_answer_error (8192, true, 8192);
  CHECK (e == 0, "whole answer gave %d", e);
  e = rbd_answer_error (4096, true, 8192);
  CHECK (e == EIO, "write cut to 4096 of 8192 gave %d, not EIO", e);
  e = rbd_answer_error (0, true, 8192);
  CHECK (e == EIO, "nothing served gave %d, not EIO", e);
  e = rbd_answer_error (-EROFS, true, 8192);
  CHECK (e == EROFS, "EROFS passed on as %d", e);
  /* rbd_aio_write: 0, cut or not; errors still pass through. */
  e = rbd_answer_error (0, false, 8192);
  CHECK (e == 0, "asynchronous write's 0 gave %d", e);
  e = rbd_answer_error (-ETIMEDOUT, false, 8192);
  CHECK (e == ETIMEDOUT, "ETIMEDOUT passed on as %d", e);
  return 0;
}
