/* An overlay with a flag bit this mloop does not know, as a newer
 * mloop may set: format version 2 has no rule for such bits, and an
 * mloop that ignored the spent flag (4) served spent overlays.  Opened
 * over a base (here by a commit) it is refused, naming the bit, and
 * the base is left alone.  About 0.05 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)
#define HDR_FLAGS 4072

int
main (void)
{
  char image[4096], path[4096], err[512];
  unsigned char w[4];
  uint32_t flags;
  const char *dir;
  int fd, r;

  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  snprintf (image, sizeof image, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (image, BASE_SIZE, "a base");
  unit_make_overlay (image, path);

  fd = open (path, O_RDWR | O_CLOEXEC);
  CHECK (fd >= 0 && pread (fd, w, 4, HDR_FLAGS) == 4, "%s: %s", path,
         strerror (errno));
  flags = w[0] | w[1] << 8 | (uint32_t) w[2] << 16 | (uint32_t) w[3] << 24;
  flags |= 16;
  for (int i = 0; i < 4; i++)
    w[i] = (unsigned char) (flags >> (8 * i));
  CHECK (pwrite (fd, w, 4, HDR_FLAGS) == 4 && close (fd) == 0, "%s: %s",
         path, strerror (errno));

  r = mloop_overlay_merge (path, image, false, false, err, sizeof err);
  CHECK (r < 0, "a commit ignored flag 16 it does not know");
  printf ("refused: %s\n", err);
  CHECK (strstr (err, "0x10") != NULL, "the refusal does not name the bit");
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the overlay's clusters were written");
  printf ("ok: an unknown flag is refused\n");
  return 0;
}
