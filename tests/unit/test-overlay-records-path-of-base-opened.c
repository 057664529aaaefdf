/* The header records the base's path as realpath finds it, after the
 * base is open.  Root serving a user's image through a symbolic link in
 * the user's directory: the user points the link at a file of root's
 * they may read between the open and the realpath.  The header then
 * named root's file, with the identity and fingerprint of the user's
 * image, a copy of it; a later commit took that path, canonical, and
 * wrote the overlay's clusters, the user's writes through the device,
 * into root's file.  The path recorded must name the file opened, or
 * the overlay is not made.
 *
 * The swap is made between mloop_backing_open and mloop_overlay_open,
 * as a server does them.  No root: about 0.05 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static void
point (const char *link, const char *to)
{
  CHECK ((unlink (link) == 0 || errno == ENOENT) && symlink (to, link) == 0,
         "%s: %s", link, strerror (errno));
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char image[4096], link[4096], target[4096], path[4096], err[512];
  struct mloop_backing base;
  struct mloop_overlay ov;
  char *recorded = NULL;
  uint64_t size;
  bool known;
  int r;

  unit_deadline (30);
  snprintf (image, sizeof image, "%s/image.img", dir);
  snprintf (link, sizeof link, "%s/link.img", dir);
  snprintf (target, sizeof target, "%s/root.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_tagged_image (target, BASE_SIZE, "template");
  unit_make_tagged_image (image, BASE_SIZE, "template");

  point (link, image);
  CHECK (mloop_backing_open (&base, link, MLOOP_DIRECT_OFF, false, NULL, err,
                             sizeof err) == 0, "base: %s", err);
  point (link, target);
  r = mloop_overlay_open (&ov, path, &base, false, MLOOP_OVERLAY_SAME_BASE,
                          err, sizeof err);
  if (r == 0) {
    mloop_overlay_close (&ov);
    CHECK (mloop_overlay_inspect (path, &recorded, &size, &known, err,
                                  sizeof err) == 0, "inspect: %s", err);
    CHECK (strcmp (recorded, target) != 0, "the overlay over %s records "
           "%s, the file its path named after it was opened", image,
           recorded);
    free (recorded);
  }
  else
    printf ("refused: %s\n", err);
  mloop_backing_close (&base);
  printf ("ok: an overlay records no path but its base's\n");
  return 0;
}
