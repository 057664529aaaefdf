/* A user's overlay committed by root writes only a base its owner may
 * write: the owner's ids are taken and the kernel asked.  Asked of the
 * open base alone (its /proc/self/fd entry), the kernel looks at the
 * file's mode and nothing on the way to it, so a file of mode 0666 in a
 * directory only root may enter counted as the owner's to write, though
 * no open of theirs could reach it (the usual way to shut users out of
 * a tree, or a file root keeps behind a private directory).  The header
 * is its owner's to write and may name that file, with the merge's
 * mark, its device and inode (which /proc/locks shows of any file a
 * server holds); root's commit then wrote the owner's clusters into it.
 * The owner must reach the base by the path the commit writes, too.
 *
 * Root (chown, and the check's own change of ids): about 0.05 s, in the
 * unit suite of every tier; skipped without root or when the uid below
 * is known here.
 */
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define STRANGER_UID 4000123
#define BASE_SIZE (1u << 20)

int
main (void)
{
  const char *dir;
  char private[2048], image[4096], path[4096], err[512];
  char *written = NULL;

  if (geteuid () != 0)
    unit_skip ("needs root to give the overlay away");
  if (getpwuid (STRANGER_UID) != NULL)
    unit_skip ("uid %u is known here", STRANGER_UID);
  unit_deadline (30);
  dir = unit_tmpdir ("/var/tmp");
  unit_runtime_dir (dir);
  snprintf (private, sizeof private, "%s/private", dir);
  snprintf (image, sizeof image, "%s/image.img", private);
  snprintf (path, sizeof path, "%s/overlay", dir);
  CHECK (chmod (dir, 0755) == 0 && mkdir (private, 0700) == 0, "%s: %s",
         private, strerror (errno));
  unit_make_image (image, BASE_SIZE);
  /* Anyone's to write, were it not for the directory. */
  CHECK (chmod (image, 0666) == 0, "%s: %s", image, strerror (errno));
  unit_make_overlay (image, path);
  CHECK (chown (path, STRANGER_UID, STRANGER_UID) == 0 &&
         chmod (path, 0600) == 0, "%s: %s", path, strerror (errno));

  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == -1,
         "a commit wrote %s, which the overlay's owner cannot reach",
         written ? written : "(null)");
  printf ("refused: %s\n", err);
  free (written);
  written = NULL;
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0,
         "the base behind the private directory was written");

  /* Let in (search only), the owner may write it. */
  CHECK (chmod (private, 0711) == 0, "%s: %s", private, strerror (errno));
  CHECK (mloop_overlay_file_commit (path, NULL, false, &written, err,
                                    sizeof err) == 0,
         "a commit refused a base its owner may reach and write: %s", err);
  free (written);
  CHECK (unit_byte_at (image, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the base does not hold the overlay's clusters");
  printf ("ok: a commit writes only a base its owner may reach\n");
  return 0;
}
