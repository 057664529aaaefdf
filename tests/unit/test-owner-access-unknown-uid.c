/* Whether an overlay's owner may write a base (engine/owner_access.c),
 * for an owner the user database does not know: the check must not
 * lend them the group of the overlay file, which is not theirs to have
 * (a file made in a setgid directory takes the directory's group,
 * whoever makes it).  Here the overlay is owned by an unknown uid with
 * the base's group, and the base only its group may write: refused.
 * Root (chown, and the check's own change of ids): about 0.01 s, in the
 * unit suite of every tier; skipped without root or when the ids below
 * are known here.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "owner_access.h"
#include "unit.h"

#define STRANGER_UID 4000123
#define STRANGER_GID 4000124

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char owned[4096], target[4096], user[256], err[256];
  int ofd, tfd, r;

  unit_deadline (10);
  if (geteuid () != 0)
    unit_skip ("needs root to give files away");
  if (getpwuid (STRANGER_UID) != NULL || getgrgid (STRANGER_GID) != NULL)
    unit_skip ("uid %u or gid %u is known here", STRANGER_UID,
               STRANGER_GID);
  snprintf (owned, sizeof owned, "%s/overlay", dir);
  snprintf (target, sizeof target, "%s/base.img", dir);
  ofd = open (owned, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  tfd = open (target, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
  CHECK (ofd >= 0 && tfd >= 0, "create: %s", strerror (errno));
  /* The directory must let the stranger reach the base at all. */
  CHECK (chmod (dir, 0755) == 0, "chmod %s: %s", dir, strerror (errno));
  CHECK (fchown (ofd, STRANGER_UID, STRANGER_GID) == 0 &&
         fchown (tfd, 0, STRANGER_GID) == 0 && fchmod (tfd, 0660) == 0,
         "chown: %s", strerror (errno));

  r = mloop_owner_may_write (ofd, tfd, target, user, sizeof user, err,
                             sizeof err);
  CHECK (r == 0, "an unknown owner may write a base through the overlay "
         "file's group (%d: %s)", r, r < 0 ? err : "");
  CHECK (strstr (user, "4000123") != NULL, "the owner is named: %s", user);

  printf ("ok: an unknown owner is not lent the overlay file's group\n");
  return 0;
}
