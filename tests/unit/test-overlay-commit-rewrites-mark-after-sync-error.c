/* A commit whose mark's sync failed writes the mark again the next
 * time (engine/overlay.c, mloop_overlay_note_merging).
 *
 * A commit marks the overlay, syncs the mark, then writes the base.
 * When that sync fails the commit stops; but the kernel then holds the
 * header's page as clean though it never reached the disk, and reports
 * the error once: the next commit, reading the mark back from the page
 * cache, took it for written, skipped writing and syncing it, and wrote
 * the base.  A power cut then left a half-merged base under a header
 * without a mark, which discard would have removed the overlay of.
 *
 * A failed sync now also marks the overlay, and no commit runs again
 * until its owner clears that (whose sync may make the page's mark
 * durable after all); the commit still writes and syncs its own first.
 *
 * This program's write and sync calls stand in for the C library's
 * (the engine is linked in statically): they note, for the overlay and
 * the base, each header write, sync and base write, and make the first
 * commit's sync of the overlay fail.  No root: about 0.03 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static struct stat overlay_st, base_st;
/* What happened, in order: H a write of the overlay's header, S a sync
 * of the overlay, F one made to fail, B a write into the base.
 */
static char events[4096];
static size_t n_events;
/* Armed: the first sync of the overlay after a write of its header
 * fails (the mark's, not the sync of the map an open makes).
 */
static bool fail_mark_sync, header_written;

static bool
is_file (int fd, const struct stat *want)
{
  struct stat st;

  return want->st_ino != 0 && fstat (fd, &st) == 0 &&
    st.st_dev == want->st_dev && st.st_ino == want->st_ino;
}

static void
note (char what)
{
  if (n_events + 1 < sizeof events)
    events[n_events++] = what;
}

static void
note_write (int fd, off_t offset)
{
  if (offset == 0 && is_file (fd, &overlay_st)) {
    note ('H');
    header_written = true;
  }
  else if (is_file (fd, &base_st))
    note ('B');
}

/* Every write of the engine goes through mloop_pwrite_all, which
 * calls pwritev2 (pwritev64v2 with 64-bit file offsets, the C library's
 * header renames it).
 */
ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  note_write (fd, offset);
  return (ssize_t) syscall (SYS_pwritev2, fd, iov, iovcnt, (long) offset,
                            0L, flags);
}

static int
sync_noted (int fd, long call)
{
  if (is_file (fd, &overlay_st)) {
    if (fail_mark_sync && header_written) {
      fail_mark_sync = false;
      note ('F');
      errno = EIO;
      return -1;
    }
    note ('S');
  }
  return unit_sync_really (fd, call);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096], err[512];
  const char *first_base_write, *header_write;
  int r;

  unit_sync_hook = sync_noted;
  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, path);
  CHECK (stat (base_path, &base_st) == 0 && stat (path, &overlay_st) == 0,
         "stat: %s", strerror (errno));

  /* The mark's sync fails: the commit stops before the base. */
  fail_mark_sync = true;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0, "a commit whose mark could not be synced went on");
  events[n_events] = '\0';
  CHECK (strstr (events, "HF") != NULL && strchr (events, 'B') == NULL,
         "the first commit: %s (H: a header write, F: its failed sync, "
         "B: a base write)",
         events);

  /* The failed sync marked the overlay, which no commit merges until
   * its owner clears it (overlay.h, sync_error); then run again: the
   * mark is written and synced before the base.
   */
  CHECK (stat (path, &overlay_st) == 0, "stat: %s", strerror (errno));
  r = mloop_overlay_clear_sync_failed (path, &overlay_st, err, sizeof err);
  CHECK (r == 0, "clear: %s", err);
  n_events = 0;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r == 0, "commit run again: %s", err);
  events[n_events] = '\0';
  first_base_write = strchr (events, 'B');
  CHECK (first_base_write != NULL, "the commit wrote no base: %s", events);
  header_write = memchr (events, 'H', (size_t) (first_base_write - events));
  CHECK (header_write != NULL && memchr (header_write, 'S',
                                         (size_t) (first_base_write -
                                                   header_write)) != NULL,
         "the commit run again wrote the base (%s: H header write, S "
         "sync, B base write) without writing and syncing its mark again "
         "first: after the failed sync the mark may be nowhere but in the "
         "page cache, and a power cut would leave the base half-merged "
         "with no mark", events);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not merge the overlay's cluster");
  return 0;
}
