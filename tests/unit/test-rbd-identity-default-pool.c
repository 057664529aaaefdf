/* Whether two RBD names are one image (device/store_name.c), as attach
 * asks before a second device of an image: "rbd:IMAGE" is the default
 * pool's image, the one "rbd:rbd/IMAGE" names, whatever options either
 * carries; another pool's, a namespace's or a snapshot's is another.
 */
#include <string.h>

#include <glib.h>

#include "store_name.h"
#include "unit.h"

static void
same (const char *a, const char *b, int want)
{
  g_autofree char *ia = mloop_image_identity (a);
  g_autofree char *ib = mloop_image_identity (b);

  CHECK ((strcmp (ia, ib) == 0) == want, "%s (%s) and %s (%s): %s", a, ia,
         b, ib, want ? "one image, told apart" : "two images, taken as one");
}

int
main (void)
{
  same ("rbd:disk", "rbd:rbd/disk", 1);
  same ("rbd:disk:id=mloop", "rbd:rbd/disk:conf=/etc/ceph/ceph.conf", 1);
  same ("rbd:disk@snap", "rbd:rbd/disk@snap", 1);
  same ("rbd:disk", "rbd:vms/disk", 0);
  same ("rbd:disk", "rbd:rbd/ns/disk", 0);
  same ("rbd:disk", "rbd:disk@snap", 0);
  same ("/srv/disk.img", "/srv/disk.img", 1);
  return 0;
}
