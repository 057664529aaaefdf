/* Unit tests for the IO engine driven through its pool of AIO rings
 * (pooled.h), on a real file:
 *  - both pool modes serve concurrent synchronous callers (16 threads,
 *    mixed aligned, unaligned-buffer and unaligned-offset requests) with
 *    the right data and no deadlock;
 *  - the asynchronous interface completes every request exactly once;
 *  - up-front refusals (range, read-only) do no IO;
 *  - start/stop leaves no thread or context behind (run under valgrind).
 */
#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pooled.h"

#define FILE_SIZE (8u << 20)
#define CALLERS 16
#define ROUNDS 300

static char path[] = "/var/tmp/mloop-unit-XXXXXX";
static unsigned char *expected;

/* Byte at OFFSET of the image as each caller leaves it. */
static unsigned char
byte_at (uint64_t offset)
{
  return (unsigned char) (offset * 7 + offset / 4096);
}

/* Kernel AIO contexts of this process: each maps its ring as "[aio]". */
static int
aio_contexts (void)
{
  FILE *f = fopen ("/proc/self/maps", "r");
  char line[512];
  int n = 0;

  assert (f);
  while (fgets (line, sizeof line, f))
    if (strstr (line, "[aio]"))
      n++;
  fclose (f);
  return n;
}

static void
make_file (void)
{
  int fd = mkstemp (path);
  size_t i;

  assert (fd >= 0);
  expected = malloc (FILE_SIZE);
  assert (expected);
  for (i = 0; i < FILE_SIZE; i++)
    expected[i] = byte_at (i);
  assert (write (fd, expected, FILE_SIZE) == FILE_SIZE);
  close (fd);
}

static struct mloop_pooled *
open_engine (enum mloop_pool_mode mode, bool writable, unsigned rings)
{
  static struct mloop_engine e;
  static struct mloop_pooled p;
  struct mloop_engine_config cfg;
  char err[256];

  mloop_engine_config_init (&cfg);
  cfg.path = path;
  cfg.want_write = writable;
  /* A queue depth of 8, small, so callers wait for slots. */
  if (mloop_engine_open (&e, &cfg, err, sizeof err) < 0 ||
      mloop_pooled_start (&p, &e, rings, 8, mode, err, sizeof err) < 0) {
    fprintf (stderr, "engine: %s\n", err);
    exit (1);
  }
  return &p;
}

static void
close_engine (struct mloop_pooled *p)
{
  mloop_pooled_stop (p);
  mloop_engine_close (p->engine);
}

struct caller {
  struct mloop_pooled *e;
  unsigned id;
};

/* Each caller owns a 512 KiB slice and rewrites/reads it in shapes that
 * exercise every path of prepare_rw.
 */
static void *
caller_main (void *arg)
{
  struct caller *c = arg;
  const uint64_t slice = FILE_SIZE / CALLERS, base = c->id * slice;
  unsigned char *buf = malloc (65536 + 1);
  unsigned r;

  assert (buf);
  for (r = 0; r < ROUNDS; r++) {
    uint64_t off = base + (r * 4096) % (slice - 65536);
    size_t len = 4096;
    unsigned char *p = buf;

    switch (r % 4) {
    case 0: break;                                  /* aligned, maybe */
    case 1: p = buf + 1; break;                     /* unaligned buffer */
    case 2: off += 3; len = 1000; break;            /* unaligned offset */
    case 3: len = 65536; break;                     /* bigger */
    }
    memcpy (p, expected + off, len);
    assert (mloop_pooled_pwrite (c->e, p, len, off, r % 8 == 0 ? MLOOP_IO_FUA : 0) == 0);
    memset (p, 0, len);
    assert (mloop_pooled_pread (c->e, p, len, off) == 0);
    assert (memcmp (p, expected + off, len) == 0);
  }
  free (buf);
  return NULL;
}

static void
test_concurrent_callers (enum mloop_pool_mode mode, unsigned rings)
{
  struct mloop_pooled *e = open_engine (mode, true, rings);
  pthread_t t[CALLERS];
  struct caller c[CALLERS];
  unsigned i;

  for (i = 0; i < CALLERS; i++) {
    c[i].e = e;
    c[i].id = i;
    assert (pthread_create (&t[i], NULL, caller_main, &c[i]) == 0);
  }
  for (i = 0; i < CALLERS; i++)
    pthread_join (t[i], NULL);
  assert (mloop_pooled_flush (e) == 0);
  close_engine (e);
}

static atomic_int completions;

static void
count_completion (struct mloop_io *io, int error)
{
  assert (error == 0);
  atomic_fetch_add (&completions, 1);
}

static void
test_async (void)
{
  int contexts_before = aio_contexts ();
  struct mloop_pooled *e = open_engine (MLOOP_POOL_REAPER_THREADS, false, 2);
  enum { N = 200 };

  /* The check at the end of main() can see contexts: two rings, two. */
  assert (aio_contexts () == contexts_before + 2);
  struct mloop_io *ios = calloc (N, sizeof *ios);
  unsigned char *bufs = malloc ((size_t) N * 4096);
  int i;

  assert (ios && bufs);
  atomic_store (&completions, 0);
  for (i = 0; i < N; i++) {
    ios[i].op = MLOOP_IO_READ;
    ios[i].buf = bufs + (size_t) i * 4096;
    ios[i].count = 4096;
    ios[i].offset = (uint64_t) i * 4096;
    ios[i].complete = count_completion;
    assert (mloop_pooled_submit (e, &ios[i]) == 0);
  }
  while (atomic_load (&completions) < N)
    usleep (1000);
  for (i = 0; i < N; i++)
    assert (memcmp (bufs + (size_t) i * 4096, expected + (size_t) i * 4096,
                    4096) == 0);
  close_engine (e);
  assert (atomic_load (&completions) == N);
  free (ios);
  free (bufs);
}

static void
test_refusals (void)
{
  struct mloop_pooled *e = open_engine (MLOOP_POOL_CALLER_REAPS, false, 1);
  char buf[4096];

  assert (!mloop_engine_info (e->engine)->writable);
  assert (mloop_pooled_pread (e, buf, 4096, FILE_SIZE) == -EINVAL);
  assert (mloop_pooled_pread (e, buf, 4096, UINT64_MAX - 100) == -EINVAL);
  assert (mloop_pooled_pwrite (e, buf, 4096, 0, 0) == -EPERM);
  assert (mloop_pooled_pread (e, buf, 0, 0) == 0);
  close_engine (e);

  e = open_engine (MLOOP_POOL_CALLER_REAPS, true, 1);
  assert (mloop_pooled_pwrite (e, buf, 4096, FILE_SIZE - 2048, 0) == -ENOSPC);
  close_engine (e);
}

/* Entries in a /proc/self directory: open descriptors or threads. */
static int
count_entries (const char *dir)
{
  DIR *d = opendir (dir);
  struct dirent *ent;
  int n = 0;

  assert (d);
  while ((ent = readdir (d)) != NULL)
    if (ent->d_name[0] != '.')
      n++;
  closedir (d);
  return n;
}

int
main (void)
{
  int fds, threads;
  int contexts;

  make_file ();
  fds = count_entries ("/proc/self/fd");
  threads = count_entries ("/proc/self/task");
  contexts = aio_contexts ();
  test_concurrent_callers (MLOOP_POOL_CALLER_REAPS, 4);
  test_concurrent_callers (MLOOP_POOL_CALLER_REAPS, 1);
  test_concurrent_callers (MLOOP_POOL_REAPER_THREADS, 4);
  test_async ();
  test_refusals ();
  /* Every engine was closed: nothing may be left behind. */
  assert (count_entries ("/proc/self/fd") == fds);
  assert (count_entries ("/proc/self/task") == threads);
  assert (aio_contexts () == contexts);
  unlink (path);
  free (expected);
  printf ("ok: engine, both pool modes, %d callers x %d rounds\n",
          CALLERS, ROUNDS);
  return 0;
}
