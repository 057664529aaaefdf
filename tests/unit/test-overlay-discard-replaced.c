/* `mloop overlay discard` removes only the overlay whose header it
 * checked (device/overlay_file.c).  The header is read before the state
 * lock is taken; a file renamed over the overlay's name meanwhile is no
 * overlay, and must stay.
 *
 * Deterministic: this test holds the state lock while a child runs the
 * discard, waits (inotify) for the discard to close the header it read,
 * renames a plain file over the overlay's name, then lets the discard
 * go on.  No root, no clock: about 0.05 s, in the unit suite of every
 * tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backing.h"
#include "held_discard.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], other[4096];
  struct held_discard discard;
  int fd, status;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (other, sizeof other, "%s/precious", dir);
  unit_make_image (base_path, BASE_SIZE);
  fd = open (other, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  CHECK (fd >= 0 && write (fd, "keep", 4) == 4 && close (fd) == 0,
         "%s: %s", other, strerror (errno));
  unit_make_empty_overlay (base_path, path);

  held_discard_start (&discard, path, held_discard_run);
  CHECK (rename (other, path) == 0, "rename: %s", strerror (errno));
  status = held_discard_finish (&discard);
  CHECK (access (path, F_OK) == 0, "the discard removed %s, a plain file "
         "renamed over the overlay after its header was checked", path);
  CHECK (WIFEXITED (status) && WEXITSTATUS (status) == 1,
         "the discard did not refuse the replaced file");
  printf ("ok: a file renamed over the overlay is not discarded\n");
  return 0;
}
