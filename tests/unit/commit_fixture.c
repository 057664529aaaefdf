/* The unit tests of a commit that could not remove its overlay
 * (commit_fixture.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "commit_fixture.h"
#include "overlay_file.h"
#include "unit.h"

void
unit_commit_unremoved (const char *path, const char *dir, char *err,
                       size_t errlen)
{
  char cmd[8192];
  char *written = NULL;
  int r;

  snprintf (cmd, sizeof cmd, "chattr +a %s 2>/dev/null", dir);
  if (system (cmd) != 0)
    unit_skip ("chattr +a failed");
  r = mloop_overlay_file_commit (path, NULL, false, &written, err, errlen);
  free (written);
  printf ("commit: %d: %s\n", r, r ? err : "ok");
  snprintf (cmd, sizeof cmd, "chattr -a %s", dir);
  CHECK (system (cmd) == 0, "chattr -a");
  CHECK (r == -1 && access (path, F_OK) == 0, "expected the removal to fail");
}
