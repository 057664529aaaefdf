/* `mloop overlay adopt` reads the image it records under the image's
 * shared lock, as a server does (engine/overlay_merge.c,
 * mloop_overlay_adopt).  A commit of another overlay into that image
 * holds it exclusively while it writes: adopted meanwhile, the image
 * would be recorded half-merged, its fingerprint and modification time
 * as they were part-way, and the commit's last writes, within one
 * timestamp tick of that, would go unseen when the overlay is served.
 *
 * The commit is played by this program holding the image's exclusive
 * lock, as the merge takes it (mloop_lock_image).  No root: about
 * 0.02 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fileio.h"
#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (4u << 20)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], other_path[4096], ov_path[4096], err[1024];
  int held, r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (other_path, sizeof other_path, "%s/other.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/a.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_image (other_path, BASE_SIZE);
  unit_make_empty_overlay (base_path, ov_path);

  /* A commit into OTHER under way. */
  held = open (other_path, O_RDWR | O_CLOEXEC);
  CHECK (held >= 0, "%s: %s", other_path, strerror (errno));
  r = mloop_lock_image (held, true);
  CHECK (r == 0, "the image's exclusive lock: %s", strerror (-r));
  r = mloop_overlay_adopt (ov_path, other_path, err, sizeof err);
  CHECK (r < 0, "an image was adopted while a commit held it");
  CHECK (strstr (err, "being merged") != NULL && strstr (err, other_path),
         "the refusal does not say why: %s", err);

  /* The commit over: adopted. */
  CHECK (close (held) == 0, "close: %s", strerror (errno));
  r = mloop_overlay_adopt (ov_path, other_path, err, sizeof err);
  CHECK (r == 0, "adopt once the commit ended: %s", err);

  printf ("ok: adopt reads the image under its shared lock\n");
  return 0;
}
