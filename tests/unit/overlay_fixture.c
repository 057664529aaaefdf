/* What the overlay unit tests share (overlay_fixture.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "align.h"
#include "backing.h"
#include "overlay_fixture.h"
#include "range_lock.h"
#include "unit.h"

void
unit_runtime_dir (const char *dir)
{
  char run[4096];

  snprintf (run, sizeof run, "%s/run", dir);
  CHECK (mkdir (run, 0700) == 0, "%s: %s", run, strerror (errno));
  setenv ("MLOOP_RUNTIME_DIR", run, 1);
}

void
unit_open_overlay (struct mloop_backing *base, struct mloop_overlay *ov,
                   const char *base_path, const char *path)
{
  char err[512];
  int r;

  r = mloop_backing_open (base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                          err, sizeof err);
  CHECK (r == 0, "base: %s", err);
  r = mloop_overlay_open (ov, path, base, false, MLOOP_OVERLAY_SAME_BASE,
                          err, sizeof err);
  CHECK (r == 0, "overlay: %s", err);
}

void
unit_make_empty_overlay (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;

  unit_open_overlay (&base, &ov, base_path, path);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

void
unit_make_overlay (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct mloop_range_lock lock;
  char *buf = mloop_alloc_aligned (MLOOP_OVERLAY_CLUSTER,
                                   MLOOP_OVERLAY_CLUSTER);
  int r;

  CHECK (buf != NULL, "no memory");
  unit_open_overlay (&base, &ov, base_path, path);
  mloop_range_lock_init (&lock);
  memset (buf, 0x5a, MLOOP_OVERLAY_CLUSTER);
  r = mloop_overlay_rw (&ov, &base, &lock, true, buf, MLOOP_OVERLAY_CLUSTER,
                        UNIT_OVERLAY_CLUSTER_AT, false);
  CHECK (r == 0, "write: %s", strerror (-r));
  mloop_range_lock_destroy (&lock);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  mloop_free_aligned (buf, MLOOP_OVERLAY_CLUSTER);
}
