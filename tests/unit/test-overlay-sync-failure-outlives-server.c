/* A failed sync of an overlay fails every later FLUSH, also of the
 * servers after the one that saw it (engine/overlay.c,
 * OVERLAY_FLAG_SYNC_FAILED), until the owner clears it.
 *
 * The kernel reports a failed writeback once to each open file, and to
 * no file opened after one has taken it.  A server that kept the error
 * in memory alone forgot it when it stopped: the device's server
 * restarted (an orderly stop whose close took it, or a crash and a next
 * server whose open took it, or a FUA write's sync that took it as
 * perhaps the write's own want of space) answered the next FLUSH with
 * success over the lost pages.
 *
 * This program's fdatasync stands in for the C library's (the engine is
 * linked in statically): armed, the next sync of the overlay file fails
 * with ENOSPC, as one whose writeback a full disk failed.  Each case
 * failed before the mark: the next server's commit succeeded, or the
 * FUA failure left no mark.  No root: about 0.05 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define HDR_FLAGS 4072          /* design.md, "The format" */
#define FLAG_SYNC_FAILED 8u

static struct stat overlay_st;
/* How many of the overlay's next syncs fail, and how many succeeded. */
static int fail_syncs;
static int good_syncs;

static int
sync_armed (int fd, long call)
{
  struct stat st;

  if (fstat (fd, &st) == 0 && st.st_dev == overlay_st.st_dev &&
      st.st_ino == overlay_st.st_ino) {
    if (fail_syncs > 0) {
      fail_syncs--;
      errno = ENOSPC;
      return -1;
    }
    good_syncs++;
  }
  return unit_sync_really (fd, call);
}

static void
make_fresh (const char *base_path, const char *path)
{
  unlink (path);
  unit_make_empty_overlay (base_path, path);
  CHECK (stat (path, &overlay_st) == 0, "stat: %s", strerror (errno));
}

static bool
marked (const char *path)
{
  return (unit_get_u64 (path, HDR_FLAGS) & FLAG_SYNC_FAILED) != 0;
}

/* A server started now: its FLUSH must fail. */
static void
next_server_flush_fails (const char *base_path, const char *path,
                         const char *after)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  int r;

  unit_open_overlay (&base, &ov, base_path, path);
  r = mloop_overlay_commit (&ov);
  CHECK (r < 0, "%s: the next server's FLUSH succeeded over lost writes",
         after);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], other_path[4096], path[4096], err[512];
  char long_name[4010];
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct stat st;
  int r;

  unit_sync_hook = sync_armed;
  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (other_path, sizeof other_path, "%s/other.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_tagged_image (other_path, BASE_SIZE, "other");

  /* A FLUSH fails; the server stops in order (its close commits). */
  make_fresh (base_path, path);
  unit_open_overlay (&base, &ov, base_path, path);
  fail_syncs = 1;
  CHECK (mloop_overlay_commit (&ov) == -ENOSPC, "the armed FLUSH did not fail");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  CHECK (marked (path), "a failed FLUSH left no mark in the header");
  next_server_flush_fails (base_path, path, "after an orderly stop");

  /* A version 1 overlay, whose header had no flags word: its first
   * server records its base, and with it the room for the mark.
   */
  make_fresh (base_path, path);
  unit_make_version_1 (path, "base.img");
  unit_open_overlay (&base, &ov, base_path, path);
  fail_syncs = 1;
  CHECK (mloop_overlay_commit (&ov) < 0, "the armed FLUSH did not fail");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  CHECK (marked (path), "a version 1 overlay's failed FLUSH left no mark");
  next_server_flush_fails (base_path, path, "a version 1 overlay's restart");

  /* The mark's own first sync fails too (its descriptor had not taken
   * the report: ext4 and XFS return it before any journal commit), so
   * a second one makes it durable.
   */
  make_fresh (base_path, path);
  unit_open_overlay (&base, &ov, base_path, path);
  fail_syncs = 2;
  good_syncs = 0;
  CHECK (mloop_overlay_commit (&ov) < 0, "the armed FLUSH did not fail");
  CHECK (fail_syncs == 0 && good_syncs > 0, "no sync made the mark durable "
         "after the FLUSH's and the mark's first failed (%d good)",
         good_syncs);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);

  /* A version 1 overlay whose commit's open takes the report, and one
   * whose clear's sync does: the next server still fails its FLUSH.
   */
  make_fresh (base_path, path);
  unit_make_version_1 (path, "base.img");
  fail_syncs = 1;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0 && access (path, F_OK) == 0, "a version 1 overlay's commit "
         "whose open's sync failed went on (%d %s)", r, err);
  next_server_flush_fails (base_path, path,
                           "a version 1 overlay's refused commit");
  make_fresh (base_path, path);
  unit_make_version_1 (path, "base.img");
  CHECK (stat (path, &st) == 0, "stat: %s", strerror (errno));
  fail_syncs = 1;
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r < 0, "a version 1 overlay's clear whose sync failed succeeded");
  next_server_flush_fails (base_path, path,
                           "a version 1 overlay's failed clear");

  /* The same with a base path that leaves its header no room for the
   * mark: neither commit nor clear syncs it (the report would be taken
   * and lost).  The next server records the base (version 2), whose
   * sync takes the report: marked, it refuses to serve, and the one
   * after fails its FLUSH.
   */
  memset (long_name, 'b', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = '\0';
  make_fresh (base_path, path);
  unit_make_version_1 (path, long_name);
  fail_syncs = 1;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0 && access (path, F_OK) == 0 && fail_syncs == 1,
         "a commit of a version 1 overlay with no room for the mark synced "
         "it (%d %s)", r, err);
  (void) unit_try_open_overlay (base_path, path, MLOOP_OVERLAY_SAME_BASE,
                                err, sizeof err);
  next_server_flush_fails (base_path, path, "a version 1 overlay with no "
                           "room for the mark, its commit refused");
  make_fresh (base_path, path);
  unit_make_version_1 (path, long_name);
  CHECK (stat (path, &st) == 0, "stat: %s", strerror (errno));
  fail_syncs = 1;
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r < 0 && fail_syncs == 1, "a clear of a version 1 overlay with "
         "no room for the mark synced it (%d %s)", r, err);
  (void) unit_try_open_overlay (base_path, path, MLOOP_OVERLAY_SAME_BASE,
                                err, sizeof err);
  next_server_flush_fails (base_path, path, "a version 1 overlay with no "
                           "room for the mark, its clear refused");

  /* A server killed before any sync: the next one's open takes the
   * report.  It serves, failing every FLUSH, and so does the one after.
   */
  make_fresh (base_path, path);
  fail_syncs = 1;
  r = unit_try_open_overlay (base_path, path, MLOOP_OVERLAY_SAME_BASE, err,
                             sizeof err);
  CHECK (fail_syncs == 0, "the open made no sync of the overlay");
  CHECK (marked (path), "the open's failed sync left no mark (open: %s)",
         r == 0 ? "served" : err);
  next_server_flush_fails (base_path, path, "after a failed sync at open");

  /* A FUA write fails for want of space, and its server is killed
   * before the next FLUSH: the failure's sync decided at once.
   */
  make_fresh (base_path, path);
  unit_open_overlay (&base, &ov, base_path, path);
  fail_syncs = 1;
  mloop_overlay_write_failed (&ov, -ENOSPC, true);
  CHECK (fail_syncs == 0, "a FUA write's ENOSPC was not followed by a sync");
  CHECK (marked (path), "a FUA write's lost writeback left no mark");
  CHECK (mloop_overlay_commit (&ov) < 0, "FLUSH after a FUA write's lost "
         "writeback succeeded");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);

  /* So does a plain write's: on NFS it takes the report too. */
  make_fresh (base_path, path);
  unit_open_overlay (&base, &ov, base_path, path);
  fail_syncs = 1;
  mloop_overlay_write_failed (&ov, -ENOSPC, false);
  CHECK (fail_syncs == 0 && marked (path),
         "a plain write's ENOSPC was not followed by a sync that kept it");
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);

  /* Nor is it committed into its base, its mark and all removed. */
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0 && strstr (err, "overlay clear") != NULL,
         "a commit merged an overlay marked with a failed sync (%d %s)", r,
         err);
  CHECK (access (path, F_OK) == 0 && marked (path),
         "a refused commit removed the overlay or its mark");
  make_fresh (base_path, path);
  fail_syncs = 1;
  r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
  CHECK (r < 0 && access (path, F_OK) == 0 && marked (path),
         "a commit whose own open's sync failed merged it (%d %s)", r, err);

  /* Another base recorded over the mark keeps it. */
  r = mloop_overlay_adopt (path, other_path, err, sizeof err);
  CHECK (r == 0, "adopt: %s", err);
  CHECK (marked (path), "adopting another base dropped the mark");
  next_server_flush_fails (other_path, path, "after an adoption");

  /* A clear whose own sync fails (a failure no server was told of yet)
   * keeps the mark, and sets it where there was none.
   */
  CHECK (stat (path, &st) == 0, "stat: %s", strerror (errno));
  fail_syncs = 1;
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r < 0, "a clear whose sync failed cleared the mark");
  CHECK (marked (path), "a clear whose sync failed dropped the mark");
  make_fresh (base_path, path);
  CHECK (stat (path, &st) == 0, "stat: %s", strerror (errno));
  fail_syncs = 1;
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r < 0 && marked (path), "a clear of an unmarked overlay whose sync "
         "failed left no mark (%d)", r);
  next_server_flush_fails (base_path, path, "after a clear's failed sync");
  r = mloop_overlay_adopt (path, other_path, err, sizeof err);
  CHECK (r == 0, "adopt: %s", err);

  /* Cleared by the owner, never while a server holds it. */
  unit_open_overlay (&base, &ov, other_path, path);
  CHECK (stat (path, &st) == 0, "stat: %s", strerror (errno));
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r < 0 && strstr (err, "in use") != NULL,
         "cleared while a server held the overlay: %d %s", r, err);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  r = mloop_overlay_clear_sync_failed (path, &st, err, sizeof err);
  CHECK (r == 0, "clear: %s", err);
  CHECK (!marked (path), "the mark is still there after clear");
  unit_open_overlay (&base, &ov, other_path, path);
  r = mloop_overlay_commit (&ov);
  CHECK (r == 0, "FLUSH after the mark was cleared: %s", strerror (-r));
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);

  printf ("ok: a failed sync outlives its server; clear forgets it\n");
  return 0;
}
