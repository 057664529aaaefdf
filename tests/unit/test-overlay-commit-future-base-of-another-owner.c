/* `mloop overlay commit` by a user who may write the base but does not
 * own it (a shared image, mode 0666 or group-writable) works when the
 * base is dated later than the clock (unpacked with its times, `touch
 * -d` a date to come).
 *
 * The merge sets such a base's time to now before it records it, as
 * its first write would.  It asked for the modification time alone
 * (the access time left as it was), which the kernel allows only the
 * file's owner: any other user was refused, though a write, which
 * gives the file the time of the clock just as well, is anyone's who
 * may write it.  Both times set to now is a write permission's.
 *
 * Needs root, to run the commit as a user (nobody's uid) other than
 * the base's owner: about 0.05 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define USER 65534
/* A year ahead of the clock. */
#define AHEAD ((time_t) 365 * 24 * 3600)

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  const struct timespec ahead[2] = {
    { .tv_nsec = UTIME_OMIT }, { .tv_sec = time (NULL) + AHEAD },
  };
  char users[4096], base_path[4096], ov_path[4096], err[1024];
  int status;
  pid_t pid;

  unit_deadline (30);
  if (geteuid () != 0)
    unit_skip ("needs root, to commit as a user other than the base's "
               "owner");
  snprintf (users, sizeof users, "%s/user", dir);
  snprintf (base_path, sizeof base_path, "%s/user/base.img", dir);
  snprintf (ov_path, sizeof ov_path, "%s/user/a.overlay", dir);
  CHECK (chmod (dir, 0755) == 0 && mkdir (users, 0755) == 0 &&
         chown (users, USER, USER) == 0, "%s: %s", users, strerror (errno));
  /* Root's image, which anyone may write, dated ahead of the clock. */
  unit_make_image (base_path, BASE_SIZE);
  CHECK (chmod (base_path, 0666) == 0 &&
         utimensat (AT_FDCWD, base_path, ahead, 0) == 0, "%s: %s",
         base_path, strerror (errno));

  pid = fork ();
  CHECK (pid != -1, "fork: %s", strerror (errno));
  if (pid == 0) {
    int r;

    if (setgroups (0, NULL) == -1 || setresgid (USER, USER, USER) == -1 ||
        setresuid (USER, USER, USER) == -1) {
      fprintf (stderr, "cannot become uid %d: %s\n", USER, strerror (errno));
      _exit (2);
    }
    unit_make_overlay (base_path, ov_path);
    r = mloop_overlay_merge (ov_path, base_path, false, true, err,
                             sizeof err);
    if (r < 0) {
      fprintf (stderr, "FAIL: a user who may write %s, not its owner, "
               "could not commit into it: %s\n", base_path, err);
      _exit (1);
    }
    _exit (0);
  }
  CHECK (waitpid (pid, &status, 0) == pid && WIFEXITED (status) &&
         WEXITSTATUS (status) == 0, "the commit as uid %d failed", USER);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write the base");
  CHECK (access (ov_path, F_OK) == -1, "the committed overlay stayed");

  printf ("ok: a user who may write a base dated ahead, not its owner, "
          "commits into it\n");
  return 0;
}
