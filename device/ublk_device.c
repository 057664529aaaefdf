/* mloop — an image attached through ublk (/dev/ublkbN). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <glib.h>

#include "block_queue.h"
#include "errmsg.h"
#include "partitions.h"
#include "server_process.h"
#include "store_name.h"
#include "ublk_device.h"

#define UBLK_CONTROL "/dev/ublk-control"
/* mloop-ublk starts in well under a second; a TCG guest is slower. */
#define UBLK_START_TIMEOUT_MS 60000
/* Stopping waits for the requests in flight: as long as a server. */
#define UBLK_STOP_TIMEOUT_MS 10000

static char *
ublk_program (void)
{
  return mloop_locate_program ("MLOOP_UBLK_BIN", "ublk/mloop-ublk",
                               MLOOP_SBINDIR "/mloop-ublk");
}

bool
mloop_ublk_available (char *err, size_t errlen)
{
  g_autofree char *prog = ublk_program ();

  if (access (UBLK_CONTROL, R_OK | W_OK) != 0) {
    mloop_fail (err, errlen, "%s: %s (the kernel's ublk driver is not "
                "loaded: modprobe ublk_drv, Linux 6.0 or later)",
                UBLK_CONTROL, strerror (errno));
    return false;
  }
  if (!g_file_test (prog, G_FILE_TEST_IS_EXECUTABLE)) {
    mloop_fail (err, errlen, "%s is not installed (mloop was built without "
                "liburing)", prog);
    return false;
  }
  return true;
}

bool
mloop_ublk_refuses (const struct mloop_attach_request *req,
                    char *err, size_t errlen)
{
  const char *what = NULL;

  if (strstr (req->file, "://"))
    what = "a remote export (NBD carries it: --transport nbd)";
  else if (req->index >= 0 && !req->ublk_index)
    what = "--device /dev/nbdN (a ublk device is /dev/ublkbN)";
  else if (req->server)
    what = "--server (mloop-ublk serves a ublk device)";
  else if (req->threads)
    what = "--threads (each hardware queue has its own thread: use "
      "--connections)";
  else if (req->timeout)
    what = "--timeout (no request times out: IO waits for a server)";
  else if (req->autoclear)
    what = "--autoclear";
  if (what == NULL)
    return false;
  mloop_fail (err, errlen, "the ublk transport does not take %s", what);
  return true;
}

bool
mloop_ublk_device_present (int index)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/ublkb%d", index);

  return g_file_test (path, G_FILE_TEST_IS_DIR);
}

/* Whether ublk_drv still has device INDEX, started or not: its
 * character device outlives the disk when mloop-ublk is killed.
 */
static bool
ublk_device_exists (int index)
{
  g_autofree char *path = g_strdup_printf ("/sys/class/ublk-char/ublkc%d",
                                           index);

  return mloop_ublk_device_present (index) || g_file_test (path,
                                                           G_FILE_TEST_EXISTS);
}

/* An unsigned number from a sysfs file of /sys/block/NAME, or 0. */
static uint64_t
sysfs_number (const char *name, const char *file)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/%s/%s", name, file);
  g_autofree char *text = NULL;

  if (!g_file_get_contents (path, &text, NULL, NULL))
    return 0;
  return g_ascii_strtoull (text, NULL, 10);
}

int
mloop_ublk_read_device_file (const char *dir, int *index, char *err,
                             size_t errlen)
{
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_UBLK_DEVICE,
                                            NULL);
  g_autofree char *text = NULL;
  const char *digits;
  char *end;
  long n;

  if (!g_file_get_contents (path, &text, NULL, NULL) ||
      !g_str_has_prefix (text, "/dev/ublkb"))
    return mloop_fail (err, errlen, "mloop-ublk named no device in %s", path);
  digits = text + strlen ("/dev/ublkb");
  n = strtol (digits, &end, 10);
  if (end == digits || *end != '\n' || n < 0 || n > G_MAXINT)
    return mloop_fail (err, errlen, "%s: not a ublk device: %s", path, text);
  *index = (int) n;
  return 0;
}

/* What both mloop-ublk and its supervisor are told about SPEC, the
 * image last; ends ARGV.
 */
static void
add_spec_args (GPtrArray *argv, const struct mloop_ublk_spec *spec)
{
  if (spec->id >= 0)
    g_ptr_array_add (argv, g_strdup_printf ("--id=%d", spec->id));
  if (spec->read_only)
    g_ptr_array_add (argv, g_strdup ("--read-only"));
  if (spec->block_size)
    g_ptr_array_add (argv, g_strdup_printf ("--block-size=%u",
                                            spec->block_size));
  if (spec->io_timeout)
    g_ptr_array_add (argv, g_strdup_printf ("--io-timeout=%u",
                                            spec->io_timeout));
  mloop_add_image_args (argv, spec->offset, spec->sizelimit, spec->overlay);
  g_ptr_array_add (argv, g_strdup ("--"));
  g_ptr_array_add (argv, g_strdup (spec->image));
  g_ptr_array_add (argv, NULL);
}

char **
mloop_ublk_command (const struct mloop_ublk_spec *spec, const char *dir,
                    int recover)
{
  GPtrArray *argv = g_ptr_array_new ();
  struct mloop_ublk_spec made = *spec;

  /* A device to recover has its number: --id is for adding one. */
  if (recover >= 0)
    made.id = -1;
  g_ptr_array_add (argv, ublk_program ());
  if (recover >= 0)
    g_ptr_array_add (argv, g_strdup_printf ("--recover=%d", recover));
  else
    g_ptr_array_add (argv, g_strdup ("--recovery"));
  g_ptr_array_add (argv, g_strdup_printf ("--queues=%u", spec->queues));
  /* The directory in its command line lets detach recognise it
   * (mloop_server_stop).
   */
  g_ptr_array_add (argv, g_strdup_printf ("--device-file=%s/%s", dir,
                                          MLOOP_DIR_UBLK_DEVICE));
  g_ptr_array_add (argv, g_strdup_printf ("--pid-file=%s/%s", dir,
                                          MLOOP_DIR_SERVER_PID));
  g_ptr_array_add (argv, g_strdup_printf ("--stats-file=%s/%s", dir,
                                          MLOOP_DIR_STATS));
  /* A recovering server takes the killed one's lock over at once. */
  if (mloop_is_rbd_name (spec->image))
    g_ptr_array_add (argv, g_strdup_printf ("--lock-record=%s/%s", dir,
                                            MLOOP_DIR_RBD_LOCK));
  add_spec_args (argv, &made);
  return (char **) g_ptr_array_free (argv, FALSE);
}

/* One queue per CPU by default; never more queues than CPUs, which is
 * all ublk gives a device (NBD's connections may outnumber them).
 */
static unsigned
wanted_queues (const struct mloop_attach_request *req)
{
  unsigned cpus = g_get_num_processors ();
  unsigned n = req->connections ? req->connections : cpus;

  n = MIN (n, cpus);
  return n > MLOOP_MAX_CONNECTIONS ? MLOOP_MAX_CONNECTIONS : n;
}

/* mloop-supervisor --ublk for SPEC in DIR and the first mloop-ublk
 * beside it, which makes the device; *SUPERVISOR and *SERVER are their
 * pids once the device serves.
 */
static int
start_supervisor (const struct mloop_ublk_spec *spec, const char *dir,
                  unsigned dead_timeout, pid_t *supervisor, pid_t *server,
                  char *err, size_t errlen)
{
  g_autoptr (GPtrArray) argv = g_ptr_array_new_with_free_func (g_free);
  g_auto (GStrv) server_argv = mloop_ublk_command (spec, dir, -1);
  g_autofree char *log_file = g_build_filename (dir, MLOOP_DIR_SERVER_LOG,
                                                NULL);
  g_autofree char *pid_file = g_build_filename (dir, MLOOP_DIR_SERVER_PID,
                                                NULL);

  g_ptr_array_add (argv, mloop_locate_program ("MLOOP_SUPERVISOR_BIN",
                                               "supervisor/mloop-supervisor",
                                               MLOOP_SBINDIR
                                               "/mloop-supervisor"));
  g_ptr_array_add (argv, g_strdup_printf ("--dir=%s", dir));
  g_ptr_array_add (argv, g_strdup ("--ublk"));
  g_ptr_array_add (argv, g_strdup_printf ("--queues=%u", spec->queues));
  g_ptr_array_add (argv, g_strdup_printf ("--dead-timeout=%u", dead_timeout));
  add_spec_args (argv, spec);
  return mloop_supervised_start (argv, server_argv, log_file, pid_file, dir,
                                 UBLK_START_TIMEOUT_MS, supervisor, server,
                                 err, errlen);
}

int
mloop_ublk_attach (const struct mloop_attach_request *req, const char *file,
                   struct mloop_device_state *s, char *err, size_t errlen)
{
  const unsigned dead_timeout = req->dead_timeout ? req->dead_timeout
    : MLOOP_DEFAULT_TIMEOUT;
  const struct mloop_ublk_spec spec = {
    .image = file, .offset = req->offset, .sizelimit = req->sizelimit,
    .overlay = s->overlay, .queues = wanted_queues (req), .id = req->index,
    .block_size = req->block_size,
    .read_only = req->read_only,
    /* An unreachable cluster fails IO after as long as a dead server. */
    .io_timeout = mloop_is_rbd_name (file) ? dead_timeout : 0,
  };
  g_autofree char *name = NULL;
  char why[256];

  if (spec.id >= 0 && ublk_device_exists (spec.id))
    return mloop_fail (err, errlen, "/dev/ublkb%d is in use (the kernel "
                       "has ublk device %d)", spec.id, spec.id);
  s->transport = MLOOP_TRANSPORT_UBLK;
  s->server = NULL;
  /* How long the device may be without a server: then its IO fails, as
   * a local NBD device's does.
   */
  s->dead_timeout = dead_timeout;
  if (start_supervisor (&spec, s->dir, s->dead_timeout, &s->supervisor_pid,
                        &s->server_pid, err, errlen) == -1)
    return -1;
  mloop_step_done (req->steps, "server and device");
  if (mloop_ublk_read_device_file (s->dir, &s->index, err, errlen) == -1) {
    mloop_ublk_detach (s, why, sizeof why);
    return -1;
  }
  /* What the kernel made of it, as `mloop list` shows for nbd. */
  name = mloop_state_device_name (s);
  s->size = sysfs_number (name, "size") * 512;
  s->block_size = (uint32_t) sysfs_number (name, "queue/logical_block_size");
  s->read_only = sysfs_number (name, "ro") != 0;
  s->connections = spec.queues;
  /* ublk_drv read the partition table when the disk was added:
   * --no-partscan drops what it found.  The user's queue settings go on
   * the driver's own (no scheduler with several queues, requests of up to
   * mloop-ublk's buffer).
   */
  s->partscan = !req->no_partscan;
  if (mloop_queue_apply_options (name, req->queue_options, err,
                                 errlen) == -1 ||
      (req->no_partscan && mloop_partitions_drop (name, err, errlen) == -1) ||
      mloop_state_save (s, err, errlen) == -1) {
    mloop_ublk_detach (s, why, sizeof why);
    return -1;
  }
  mloop_step_done (req->steps, "settings, state");
  return 0;
}

int
mloop_ublk_delete (int index, char *err, size_t errlen)
{
  g_autofree char *prog = ublk_program ();
  g_autofree char *id = g_strdup_printf ("%d", index);
  g_autofree char *out = NULL;
  g_autoptr (GError) gerr = NULL;
  char *argv[] = { prog, (char *) "--delete", id, NULL };
  int status;

  if (!g_spawn_sync (NULL, argv, NULL, G_SPAWN_STDOUT_TO_DEV_NULL, NULL,
                     NULL, NULL, &out, &status, &gerr))
    return mloop_fail (err, errlen, "cannot run %s: %s", prog,
                       gerr->message);
  if (!g_spawn_check_wait_status (status, NULL)) {
    const char *why = out ? g_strstrip (out) : "";

    if (g_str_has_prefix (why, "mloop-ublk: "))
      why += strlen ("mloop-ublk: ");
    return mloop_fail (err, errlen, "deleting /dev/ublkb%d: %s", index,
                       *why ? why : "mloop-ublk failed");
  }
  return 0;
}

bool
mloop_ublk_index_reused (const char *dir, int index)
{
  size_t n;
  struct mloop_device_state *list = mloop_state_list (&n);
  bool reused = false;

  for (size_t i = 0; i < n; i++)
    reused |= list[i].transport == MLOOP_TRANSPORT_UBLK &&
      list[i].index == index && strcmp (list[i].dir, dir) != 0;
  mloop_state_free_list (list, n);
  return reused;
}

struct mloop_ublk_flush {
  /* /dev/ublkbN, closed as soon as the fsync returns: an open disk
   * holds up the DEL_DEV of a deletion that ends a held flush.
   */
  int device;
  int done;                     /* an eventfd, written once it returns */
  GThread *thread;              /* NULL: done on the caller's thread */
  int result;                   /* 0 or a negative errno */
};

static gpointer
flush_run (gpointer data)
{
  struct mloop_ublk_flush *f = data;
  uint64_t one = 1;

  f->result = fsync (f->device) == -1 ? -errno : 0;
  close (f->device);
  if (write (f->done, &one, sizeof one) == -1)
    abort ();                   /* an eventfd below its maximum cannot fail */
  return NULL;
}

struct mloop_ublk_flush *
mloop_ublk_flush_begin (int index)
{
  g_autofree char *path = g_strdup_printf ("/dev/ublkb%d", index);
  struct mloop_ublk_flush *f = g_new0 (struct mloop_ublk_flush, 1);

  f->done = -1;
  f->device = open (path, O_RDONLY | O_CLOEXEC);
  if (f->device == -1) {
    f->result = -errno;
    return f;
  }
  f->done = eventfd (0, EFD_CLOEXEC);
  if (f->done != -1)
    f->thread = g_thread_try_new ("mloop-flush", flush_run, f, NULL);
  if (f->thread == NULL) {
    /* No thread to be had: flushed here, unwatched. */
    f->result = fsync (f->device) == -1 ? -errno : 0;
    close (f->device);
  }
  return f;
}

bool
mloop_ublk_flush_wait (struct mloop_ublk_flush *f, int server_pidfd)
{
  struct pollfd watch[2] = {
    { .fd = f->done, .events = POLLIN },
    { .fd = server_pidfd, .events = POLLIN },
  };

  if (f->thread == NULL)
    return true;
  while (poll (watch, 2, -1) == -1 && errno == EINTR)
    ;
  return (watch[0].revents & POLLIN) || !(watch[1].revents & POLLIN);
}

int
mloop_ublk_flush_end (struct mloop_ublk_flush *f)
{
  int r;

  if (f->thread != NULL)
    g_thread_join (f->thread);
  r = f->result;
  if (f->done != -1)
    close (f->done);
  g_free (f);
  return r;
}

int
mloop_ublk_detach (const struct mloop_device_state *s,
                   char *err, size_t errlen)
{
  struct mloop_ublk_flush *flush = NULL;
  int server_pidfd = -1, r = 0;

  /* The device's page cache first, while its server serves it: a
   * supervisor killed first would leave it to the stop's write-back.
   * Only then: a device whose server died holds its IO (user recovery)
   * for a next one, and the flush would wait for it.  Should the server
   * die during the flush, the supervisor's stop recovers the device and
   * writes the rest back, or deletes it (ublk_keeper_stop): the flush
   * ends with that stop, not with the device's dead timeout, while the
   * state lock is held.
   */
  if (s->index >= 0 && s->server_pid > 0 &&
      mloop_server_running (s->server_pid, s->dir) &&
      ublk_device_exists (s->index) &&
      !mloop_ublk_index_reused (s->dir, s->index)) {
    server_pidfd = (int) syscall (SYS_pidfd_open, s->server_pid, 0);
    flush = mloop_ublk_flush_begin (s->index);
    if (mloop_ublk_flush_wait (flush, server_pidfd)) {
      (void) mloop_ublk_flush_end (flush);
      flush = NULL;
    }
  }
  /* SIGTERM: the supervisor stops mloop-ublk, which stops the device,
   * finishing what is in flight, and deletes it.  The supervisor first,
   * or it would start another; given time for its server's stop and its
   * overlay witness's last sync after that.
   */
  if (s->supervisor_pid > 0)
    mloop_server_stop (s->supervisor_pid, s->dir, 3 * UBLK_STOP_TIMEOUT_MS);
  if (s->server_pid > 0)
    mloop_server_stop (s->server_pid, s->dir, UBLK_STOP_TIMEOUT_MS);
  /* A supervisor killed at that timeout may have recovered the device
   * for its stop (ublk_keeper_stop): the server it recorded last, told
   * to stop, writes the page cache back itself.
   */
  if (s->supervisor_pid > 0) {
    struct mloop_device_state now = { 0 };

    if (mloop_state_load (s->dir, &now) == 0 && now.server_pid > 0 &&
        now.server_pid != s->server_pid)
      mloop_server_stop (now.server_pid, s->dir, UBLK_STOP_TIMEOUT_MS);
    mloop_state_clear (&now);
  }
  /* A device that went away (stopped from outside, or given up) may have
   * had its number given to a newer attach since: that one is not ours
   * to delete.
   */
  if (s->index >= 0 && ublk_device_exists (s->index) &&
      !mloop_ublk_index_reused (s->dir, s->index))
    r = mloop_ublk_delete (s->index, err, errlen);
  /* A flush whose server died ends with the stop or the deletion. */
  if (flush != NULL)
    (void) mloop_ublk_flush_end (flush);
  if (server_pidfd != -1)
    close (server_pidfd);
  return r;
}
