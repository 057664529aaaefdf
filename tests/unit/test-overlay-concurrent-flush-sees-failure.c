/* Two FLUSHes of an overlay at once: when the sync of one fails, the
 * other fails too (engine/overlay.c, sync_file).
 *
 * Both syncs wait on the same writeback, and the kernel tells only one
 * of them that it failed.  Each ran its own fdatasync and then read the
 * kept error: the one told nothing read it before the other had kept
 * it, and answered its FLUSH with success over the lost pages.
 *
 * This program's fdatasync stands in for the C library's (the engine is
 * linked in statically): armed, the next sync of the overlay file takes
 * the failure, waits 200 ms (the writeback both wait on), and fails
 * with ENOSPC; the other, 50 ms after, is told nothing.  Failed before
 * the overlay ran one sync at a time.  No root: about 0.3 s, in the
 * unit suite of every tier.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_fixture.h"
#include "sync_hook.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static struct stat overlay_st;
static int armed;               /* read and cleared with atomics */

static void
sleep_ms (long ms)
{
  struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

  nanosleep (&ts, NULL);
}

static int
sync_armed (int fd, long call)
{
  struct stat st;

  if (fstat (fd, &st) == 0 && st.st_dev == overlay_st.st_dev &&
      st.st_ino == overlay_st.st_ino &&
      __atomic_exchange_n (&armed, 0, __ATOMIC_ACQ_REL)) {
    sleep_ms (200);
    errno = ENOSPC;
    return -1;
  }
  return unit_sync_really (fd, call);
}

struct flush {
  struct mloop_overlay *ov;
  long delay_ms;
  int result;
};

static void *
flush_thread (void *arg)
{
  struct flush *f = arg;

  sleep_ms (f->delay_ms);
  f->result = mloop_overlay_commit (f->ov);
  return NULL;
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], path[4096];
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct flush first = { &ov, 0, 0 }, second = { &ov, 50, 0 };
  pthread_t a, b;

  unit_sync_hook = sync_armed;
  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_empty_overlay (base_path, path);
  CHECK (stat (path, &overlay_st) == 0, "stat: %s", strerror (errno));

  unit_open_overlay (&base, &ov, base_path, path);
  __atomic_store_n (&armed, 1, __ATOMIC_RELEASE);
  CHECK (pthread_create (&a, NULL, flush_thread, &first) == 0 &&
         pthread_create (&b, NULL, flush_thread, &second) == 0,
         "pthread_create failed");
  pthread_join (a, NULL);
  pthread_join (b, NULL);
  CHECK (first.result < 0 || second.result < 0,
         "neither FLUSH saw the failed sync");
  CHECK (first.result < 0 && second.result < 0,
         "one FLUSH succeeded while the other's sync failed (%s)",
         strerror (-(first.result ? first.result : second.result)));
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);

  printf ("ok: two FLUSHes at once both fail when one's sync does\n");
  return 0;
}
