/* `mloop overlay discard` and `commit` given a FIFO (or any file that
 * is not a regular one) say it is not an overlay at once.
 * Reading its header used to open it for reading, which for a FIFO
 * waits for a writer: the command hung, forever, on a mistyped name.
 * A hang fails the test by its deadline (unit_deadline).
 * No root: about 0.01 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char fifo[4096], image[4096], err[512];
  char *base = NULL;

  unit_deadline (10);
  unit_runtime_dir (dir);
  snprintf (fifo, sizeof fifo, "%s/fifo", dir);
  snprintf (image, sizeof image, "%s/image", dir);
  if (mkfifo (fifo, 0600) == -1)
    unit_skip ("mkfifo: %s", strerror (errno));

  CHECK (mloop_overlay_file_discard (fifo, err, sizeof err) == -1,
         "a FIFO was discarded as an overlay");
  CHECK (strstr (err, "not an mloop overlay") != NULL, "discard: %s", err);
  CHECK (access (fifo, F_OK) == 0, "the FIFO was removed");

  CHECK (mloop_overlay_file_commit (fifo, image, false, &base, err,
                                    sizeof err) == -1,
         "a FIFO was committed as an overlay");
  CHECK (strstr (err, "not an mloop overlay") != NULL, "commit: %s", err);
  free (base);

  printf ("ok: a FIFO is refused as an overlay at once\n");
  return 0;
}
