/* A failed writeback the engine's flush probe is told of reaches the
 * image's first FLUSH (engine/file_store.c, probe_sync_error).
 *
 * When a plain image is opened, one AIO fdatasync asks whether the
 * kernel has that command.  The kernel tells a new descriptor of a
 * failed writeback no one took yet (a server before this one, killed
 * before it synced), and tells it once: the probe took it, concluded
 * only that the command was missing, and dropped it; the first FLUSH
 * then succeeded over the lost pages.
 *
 * This program's io_getevents stands in for libaio's (the engine is
 * linked in statically, and calls it by name): armed, the first
 * fdatasync's completion says ENOSPC, as the failed writeback's report.
 * Failed before the probe kept it.  No root: about 0.05 s, in the unit
 * suite of every tier.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <libaio.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "pooled.h"
#include "unit.h"

#define IMAGE_SIZE (1u << 20)

static int armed;

int
io_getevents (io_context_t ctx, long min_nr, long nr, struct io_event *events,
              struct timespec *timeout)
{
  static int (*real) (io_context_t, long, long, struct io_event *,
                      struct timespec *);
  int n;

  if (real == NULL)
    real = dlsym (RTLD_NEXT, "io_getevents");
  n = real (ctx, min_nr, nr, events, timeout);
  for (int i = 0; i < n; i++)
    if (events[i].obj->aio_lio_opcode == IO_CMD_FDSYNC &&
        (long) events[i].res == 0 &&
        __atomic_exchange_n (&armed, 0, __ATOMIC_ACQ_REL))
      events[i].res = (unsigned long) -ENOSPC;
  return n;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char path[4096], err[256];
  struct mloop_engine_config cfg;
  struct mloop_engine e;
  struct mloop_pooled p;
  int r;

  unit_deadline (30);
  snprintf (path, sizeof path, "%s/image", dir);
  unit_make_image (path, IMAGE_SIZE);

  __atomic_store_n (&armed, 1, __ATOMIC_RELEASE);
  mloop_engine_config_init (&cfg);
  cfg.path = path;
  cfg.want_write = true;
  CHECK (mloop_engine_open (&e, &cfg, err, sizeof err) == 0, "engine: %s",
         err);
  CHECK (mloop_pooled_start (&p, &e, 1, 8, MLOOP_POOL_REAPER_THREADS, err,
                             sizeof err) == 0, "pool: %s", err);
  CHECK (!__atomic_load_n (&armed, __ATOMIC_ACQUIRE),
         "opening the image made no AIO fdatasync (no probe to test)");
  r = mloop_pooled_flush (&p);
  CHECK (r == -ENOSPC, "the first FLUSH after the probe was told of a "
         "failed writeback: %s", r ? strerror (-r) : "success");
  r = mloop_pooled_flush (&p);
  CHECK (r == 0, "the second FLUSH: %s", strerror (-r));
  mloop_pooled_stop (&p);
  mloop_engine_close (&e);

  printf ("ok: the flush probe's failed writeback reaches the first FLUSH\n");
  return 0;
}
