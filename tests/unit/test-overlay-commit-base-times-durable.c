/* `mloop overlay commit` makes the base's new modification time
 * durable before its first write into the base and with its last
 * (engine/overlay_merge.c).  Another overlay made over the same base
 * goes by that time to tell the base was written since: after a power
 * cut that kept merged bytes but not the time, it would be served over
 * them, showing the committed overlay's clusters under a filesystem of
 * its own from before.  A power cut during the merge is the same: the
 * bytes written in place reach the disk as the kernel writes them
 * back, at once under the pressure of a large merge, and the new time
 * with the filesystem's journal, seconds later (ext4 and XFS commit
 * the inode's times there).  So the time moves and is synced first.
 * And the last sync of the base is fsync(), not fdatasync(), which may
 * leave the inode's times in memory.
 *
 * This program's fsync(), fdatasync() and pwritev2() stand in for the C
 * library's (the engine is linked in statically): they note which call
 * last synced the base, the modification time that sync made durable,
 * and that time when the merge first writes into the base.  No root, no
 * clock: about 0.03 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static struct stat base_st;
/* Which call last synced the base: 0 none, 'f' fsync, 'd' fdatasync. */
static char last_base_sync;
/* The base's modification time as its last fsync left it on disk, and
 * as it was there when the merge first wrote into the base.
 */
static struct timespec durable_mtime, mtime_at_first_write;
static bool base_written;

static bool
is_base (int fd, struct stat *st)
{
  return fstat (fd, st) == 0 && st->st_dev == base_st.st_dev &&
    st->st_ino == base_st.st_ino;
}

static void
note_sync (int fd, char how)
{
  struct stat st;

  if (!is_base (fd, &st))
    return;
  last_base_sync = how;
  if (how == 'f')
    durable_mtime = st.st_mtim;
}

static int
sync_noted (int fd, long call)
{
  note_sync (fd, call == SYS_fsync ? 'f' : 'd');
  return unit_sync_really (fd, call);
}

ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  struct stat st;

  if (!base_written && is_base (fd, &st)) {
    base_written = true;
    mtime_at_first_write = durable_mtime;
  }
  return syscall (SYS_pwritev2, fd, iov, iovcnt, (long) offset, 0L, flags);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  const struct timespec long_ago[2] = {
    { .tv_sec = 1000000000 }, { .tv_sec = 1000000000 },
  };
  char base_path[4096], path[4096], err[512];
  int fd, r;

  unit_sync_hook = sync_noted;
  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  /* Dated well before the clock, and so on disk: the time every overlay
   * made over the base records.
   */
  fd = open (base_path, O_RDWR | O_CLOEXEC);
  CHECK (fd != -1 && futimens (fd, long_ago) == 0 && fstat (fd, &base_st) == 0
         && fsync (fd) == 0 && close (fd) == 0, "%s: %s", base_path,
         strerror (errno));

  unit_make_overlay (base_path, path);
  last_base_sync = 0;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit: %s", err);
  CHECK (base_written, "the commit never wrote into the base");
  CHECK (mtime_at_first_write.tv_sec != long_ago[1].tv_sec ||
         mtime_at_first_write.tv_nsec != long_ago[1].tv_nsec,
         "the commit wrote into the base before a new modification time "
         "was durable: a power cut then could keep bytes merged under the "
         "old time, and an overlay made before would be served over them");
  CHECK (last_base_sync != 0, "the commit never synced the base");
  CHECK (last_base_sync == 'f', "the commit's last sync of the base was "
         "fdatasync: its new modification time may not survive a power "
         "cut, and an overlay made before would be served over it");

  printf ("ok: a commit makes the base's times durable\n");
  return 0;
}
