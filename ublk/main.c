/* mloop-ublk IMAGE: a prototype ublk front end (issue 15).  Creates
 * /dev/ublkbN over IMAGE, prints its path, serves it until SIGTERM or
 * SIGINT, then stops and deletes the device. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control.h"
#include "engine.h"
#include "queue.h"

#define MAX_QUEUES 16

static void
usage (void)
{
  fprintf (stderr, "usage: mloop-ublk [--queues N] [--depth N] [--buffered] "
           "[--read-only] [--legacy-opcodes] IMAGE\n");
  exit (2);
}

/* /dev/ublkcN appears when ADD_DEV returns, but give devtmpfs a moment. */
static int
open_cdev (unsigned id)
{
  char path[64];
  snprintf (path, sizeof path, UBLK_CHAR_PATH, id);
  for (int i = 0; i < 100; i++) {
    int fd = open (path, O_RDWR | O_CLOEXEC);
    if (fd >= 0 || errno != ENOENT)
      return fd;
    usleep (10000);
  }
  return -1;
}

int
main (int argc, char **argv)
{
  unsigned nr_queues = 1, depth = 64, max_io = 512 << 10;
  bool buffered = false, read_only = false, legacy = false;
  static const struct option opts[] = {
    { "queues", required_argument, NULL, 'q' },
    { "depth", required_argument, NULL, 'd' },
    { "buffered", no_argument, NULL, 'b' },
    { "read-only", no_argument, NULL, 'r' },
    { "legacy-opcodes", no_argument, NULL, 'L' },
    { 0 }
  };
  for (int c; (c = getopt_long (argc, argv, "q:d:brL", opts, NULL)) != -1;) {
    switch (c) {
    case 'q': nr_queues = atoi (optarg); break;
    case 'd': depth = atoi (optarg); break;
    case 'b': buffered = true; break;
    case 'r': read_only = true; break;
    case 'L': legacy = true; break;
    default: usage ();
    }
  }
  if (optind != argc - 1 || nr_queues < 1 || nr_queues > MAX_QUEUES
      || depth < 1 || depth > UBLK_MAX_QUEUE_DEPTH)
    usage ();
  const char *image = argv[optind];

  /* The engine decides O_DIRECT (falling back to buffered IO where the
   * filesystem refuses it), the alignment, and the odd-sized tail. */
  struct mloop_engine_config cfg;
  mloop_engine_config_init (&cfg);
  cfg.path = image;
  cfg.direct = buffered ? MLOOP_DIRECT_OFF : MLOOP_DIRECT_AUTO;
  cfg.want_write = !read_only;
  struct mloop_engine engine;
  char err[256];
  int r = mloop_engine_open (&engine, &cfg, err, sizeof err);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: %s\n", err);
    return 1;
  }
  mloop_engine_probe_features (&engine);
  uint64_t size = mloop_backing_size (&engine.backing);
  unsigned lbs_shift = __builtin_ctz (engine.backing.logical_block_size);
  read_only = !engine.backing.writable;
  if (size < 512) {
    fprintf (stderr, "mloop-ublk: %s: smaller than one 512-byte sector\n", image);
    mloop_engine_close (&engine);
    return 1;
  }

  /* The queue threads inherit this mask: only sigwait below takes them. */
  sigset_t stop_sigs;
  sigemptyset (&stop_sigs);
  sigaddset (&stop_sigs, SIGTERM);
  sigaddset (&stop_sigs, SIGINT);
  pthread_sigmask (SIG_BLOCK, &stop_sigs, NULL);

  struct ublk_ctrl ctrl;
  r = ublk_ctrl_open (&ctrl, legacy);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: /dev/ublk-control: %s (is ublk_drv loaded?)\n", strerror (-r));
    return 1;
  }
  r = ublk_ctrl_add (&ctrl, nr_queues, depth, max_io);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: ADD_DEV: %s\n", strerror (-r));
    ublk_ctrl_close (&ctrl);
    return 1;
  }
  unsigned id = ctrl.info.dev_id;
  fprintf (stderr, "mloop-ublk: device %u, driver flags 0x%llx, max_io_buf_bytes %u\n",
           id, (unsigned long long) ctrl.info.flags, ctrl.info.max_io_buf_bytes);

  struct ublk_queue queues[MAX_QUEUES];
  unsigned started = 0;
  int status = 1;
  int cfd = open_cdev (id);
  if (cfd < 0) {
    fprintf (stderr, "mloop-ublk: /dev/ublkc%u: %s\n", id, strerror (errno));
    goto del;
  }
  /* A size that is no multiple of 512 loses its last bytes: ublk
   * counts in sectors. */
  r = ublk_ctrl_set_params (&ctrl, size, lbs_shift, lbs_shift > 12 ? lbs_shift : 12,
                            read_only, read_only ? 0 : 1u << 30);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: SET_PARAMS: %s\n", strerror (-r));
    goto close_cdev;
  }
  for (; started < nr_queues; started++) {
    r = ublk_queue_init (&queues[started], cfd, &engine, started, depth, ctrl.info.max_io_buf_bytes);
    if (r == 0)
      r = ublk_queue_start (&queues[started]);
    if (r < 0) {
      fprintf (stderr, "mloop-ublk: queue %u: %s\n", started, strerror (-r));
      ublk_queue_free (&queues[started]);
      goto stop;
    }
  }
  r = ublk_ctrl_start (&ctrl);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: START_DEV: %s\n", strerror (-r));
    goto stop;
  }
  printf (UBLK_BLOCK_PATH "\n", id);
  fflush (stdout);

  int sig;
  sigwait (&stop_sigs, &sig);
  status = 0;
stop:
  r = ublk_ctrl_stop (&ctrl);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: STOP_DEV: %s\n", strerror (-r));
    status = 1;
  }
  for (unsigned i = 0; i < started; i++) {
    ublk_queue_join (&queues[i]);
    if (queues[i].err) {
      fprintf (stderr, "mloop-ublk: queue %u: %s\n", i, strerror (-queues[i].err));
      status = 1;
    }
    ublk_queue_free (&queues[i]);
  }
close_cdev:
  close (cfd);
del:
  /* DEL_DEV waits for the character device to be closed: after the
   * queues, never before. */
  r = ublk_ctrl_del (&ctrl);
  if (r < 0) {
    fprintf (stderr, "mloop-ublk: DEL_DEV: %s\n", strerror (-r));
    status = 1;
  }
  ublk_ctrl_close (&ctrl);
  mloop_engine_close (&engine);
  return status;
}
