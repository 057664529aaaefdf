/* `mloop overlay commit` makes the base's new modification time
 * durable with its bytes (engine/overlay_merge.c): its last sync of the
 * base is fsync(), not fdatasync(), which may leave the inode's times
 * in memory (ext4 and XFS commit them with their journal, seconds
 * later).  Another overlay made over the same base goes by that time
 * to tell the base was written since: after a power cut that kept the
 * merged bytes but not the time, it would be served over them, showing
 * the committed overlay's clusters under a filesystem of its own from
 * before.  (The overlay's directory, synced after its removal, commits
 * the journal only when it is on the base's filesystem.)
 *
 * This program's fsync() and fdatasync() stand in for the C library's
 * (the engine is linked in statically) and note which of them last
 * synced the base.  No root, no clock: about 0.03 s, in the unit suite
 * of every tier.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static struct stat base_st;
/* Which call last synced the base: 0 none, 'f' fsync, 'd' fdatasync. */
static char last_base_sync;

static void
note_sync (int fd, char how)
{
  struct stat st;

  if (fstat (fd, &st) == 0 && st.st_dev == base_st.st_dev &&
      st.st_ino == base_st.st_ino)
    last_base_sync = how;
}

int
fsync (int fd)
{
  note_sync (fd, 'f');
  return (int) syscall (SYS_fsync, fd);
}

int
fdatasync (int fd)
{
  note_sync (fd, 'd');
  return (int) syscall (SYS_fdatasync, fd);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], err[512];
  int r;

  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  CHECK (stat (base_path, &base_st) == 0, "%s: %s", base_path,
         strerror (errno));

  unit_make_overlay (base_path, path);
  last_base_sync = 0;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit: %s", err);
  CHECK (last_base_sync != 0, "the commit never synced the base");
  CHECK (last_base_sync == 'f', "the commit's last sync of the base was "
         "fdatasync: its new modification time may not survive a power "
         "cut, and an overlay made before would be served over it");

  printf ("ok: a commit makes the base's times durable\n");
  return 0;
}
