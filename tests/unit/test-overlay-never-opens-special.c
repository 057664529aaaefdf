/* An overlay is only ever a regular file, and a path naming anything
 * else is refused before it is opened (engine/overlay.c): opening is
 * itself an act for a device node (a watchdog starts its countdown, a
 * tape rewinds when closed, a terminal may become the opener's), and
 * for a FIFO it releases whoever waits for a peer.  Each entry point
 * that opens an overlay by its path is given a FIFO: inotify must see
 * no open of it.
 * No root: about 0.02 s, in the unit suite of every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing.h"
#include "fifo_watch.h"
#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

/* Fails when the watch IN has seen the FIFO opened since last asked. */
static void
check_not_opened (int in, const char *what)
{
  CHECK (!fifo_watch_opened (in), "%s opened the FIFO", what);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char fifo[4096], base_path[4096], err[512];
  struct mloop_backing base;
  struct mloop_overlay ov;
  char *recorded = NULL;
  uint64_t size;
  bool known;
  int in;

  unit_deadline (10);
  unit_runtime_dir (dir);
  snprintf (fifo, sizeof fifo, "%s/fifo", dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  unit_make_image (base_path, BASE_SIZE);
  in = fifo_watch (fifo);

  CHECK (mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                             err, sizeof err) == 0, "base: %s", err);
  CHECK (mloop_overlay_open (&ov, fifo, &base, false, MLOOP_OVERLAY_SAME_BASE,
                             err, sizeof err) < 0,
         "a FIFO was served as an overlay");
  CHECK (strstr (err, "not a regular file") != NULL, "server: %s", err);
  check_not_opened (in, "a server");
  mloop_backing_close (&base);

  CHECK (mloop_overlay_inspect (fifo, &recorded, &size, &known, err,
                                sizeof err) < 0, "a FIFO was inspected");
  check_not_opened (in, "inspect (discard, commit)");
  CHECK (mloop_overlay_adopt (fifo, base_path, err, sizeof err) < 0,
         "a FIFO adopted a base");
  check_not_opened (in, "adopt");
  CHECK (mloop_overlay_merge (fifo, base_path, false, true, err,
                              sizeof err) < 0, "a FIFO was merged");
  check_not_opened (in, "a merge");
  CHECK (access (fifo, F_OK) == 0, "the FIFO was removed");

  printf ("ok: a FIFO named as an overlay is never opened\n");
  return 0;
}
