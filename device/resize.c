/* mloop — changing the size of an attached device while it runs. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include "attach.h"
#include "engine.h"
#include "errmsg.h"
#include "nbd_connect.h"
#include "nbd_netlink.h"
#include "partitions.h"
#include "resident_service.h"
#include "resize.h"
#include "store_name.h"

/* How long a server may take to serve the new size: nbdkit restarting
 * in a TCG guest is slow (attach allows it as long to start).
 */
#define SERVER_TIMEOUT_MS 60000
#define SERVER_POLL_MS 50

int
mloop_device_open_for_partition_scan (int index, char *err, size_t errlen)
{
  g_autofree char *dev = g_strdup_printf ("/dev/nbd%d", index);
  int fd = open (dev, O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    return mloop_fail (err, errlen, "%s: %s", dev, strerror (errno));
  close (fd);
  return 0;
}

/* The image, opened through the engine (store.h) for its size, its
 * allocation and its resize: one path for a file and an RBD image.  An
 * RBD image is opened shared, without its exclusive lock: the device's
 * server holds that, and librbd hands our resize to the holder.  It is
 * the image the device's lock record says its servers serve, not
 * whatever has its name now (`rbd mv`, then another image named so).
 */
static int
open_image (const struct mloop_device_state *s, bool for_write,
            struct mloop_engine *e, char *err, size_t errlen)
{
  g_autofree char *lock_record = mloop_is_rbd_name (s->file)
    ? mloop_state_path (s, MLOOP_DIR_RBD_LOCK) : NULL;
  struct mloop_engine_config cfg;

  mloop_engine_config_init (&cfg);
  cfg.path = s->file;
  cfg.want_write = for_write;
  cfg.direct = MLOOP_DIRECT_OFF;        /* reads no data */
  cfg.shared = true;
  cfg.lock_record = lock_record;
  return mloop_engine_open (e, &cfg, err, errlen) < 0 ? -1 : 0;
}

/* One extents reply, as mloop_first_data_past reads it. */
struct data_search {
  uint64_t first;               /* the first byte of data seen, or end */
  uint64_t covered;             /* the reply's extents end here */
};

static int
note_first_data (void *opaque, uint64_t offset, uint64_t length, bool hole)
{
  struct data_search *d = opaque;

  if (!hole && offset < d->first)
    d->first = offset;
  if (offset + length > d->covered)
    d->covered = offset + length;
  return 0;
}

int
mloop_first_data_past (struct mloop_engine *e, uint64_t from,
                       uint64_t *first)
{
  const uint64_t size = mloop_engine_size (e);
  struct data_search d = { .first = size, .covered = from };

  /* A reply may cover a prefix of the range only (NBD allows it; the
   * RBD store's stops after 1 GiB): ask again from where it ended,
   * until data or the end.
   */
  while (d.first == size && d.covered < size) {
    const uint64_t pos = d.covered;
    int r = mloop_engine_extents (e, pos, size - pos, false,
                                  note_first_data, &d);

    if (r < 0)
      return r;
    if (d.covered <= pos)
      return -EIO;              /* an empty reply would loop for ever */
  }
  *first = d.first;
  return 0;
}

/* Refuses to cut off data: the first byte at or past FROM that the image
 * stores (a filesystem without holes says every byte is data).
 */
static int
check_no_data_past (struct mloop_engine *e, uint64_t from, const char *file,
                    char *err, size_t errlen)
{
  const uint64_t size = mloop_engine_size (e);
  uint64_t first = size;
  int r;

  if (from >= size)
    return 0;
  r = mloop_first_data_past (e, from, &first);
  if (r < 0)
    return mloop_fail (err, errlen, "%s: looking for data past byte %"
                       PRIu64 ": %s", file, from,
                       r == -EIO ? "the store answered with no extents"
                       : strerror (-r));
  if (first == size)
    return 0;
  return mloop_fail (err, errlen, "shrinking to %" PRIu64 " bytes would cut "
                     "off data: byte %" PRIu64 " of %s is in use (the first "
                     "past the new size); nothing was changed", from, first,
                     file);
}

/* Refuses to cut a partition of /dev/nbdINDEX short. */
static int
check_partitions (int index, uint64_t size, char *err, size_t errlen)
{
  g_autofree char *sys = g_strdup_printf ("/sys/block/nbd%d", index);
  g_autofree char *prefix = g_strdup_printf ("nbd%dp", index);
  GDir *dir = g_dir_open (sys, 0, NULL);
  const char *name;
  int r = 0;

  while (dir && r == 0 && (name = g_dir_read_name (dir)) != NULL) {
    g_autofree char *start_path = NULL, *size_path = NULL;
    g_autofree char *start_text = NULL, *size_text = NULL;
    uint64_t end;

    if (!g_str_has_prefix (name, prefix))
      continue;
    start_path = g_build_filename (sys, name, "start", NULL);
    size_path = g_build_filename (sys, name, "size", NULL);
    if (!g_file_get_contents (start_path, &start_text, NULL, NULL) ||
        !g_file_get_contents (size_path, &size_text, NULL, NULL))
      continue;
    /* Both in 512-byte sectors, whatever the block size. */
    end = (g_ascii_strtoull (start_text, NULL, 10) +
           g_ascii_strtoull (size_text, NULL, 10)) * 512;
    if (end > size)
      r = mloop_fail (err, errlen, "shrinking to %" PRIu64 " bytes would cut "
                      "off partition /dev/%s, which ends at byte %" PRIu64
                      "; nothing was changed", size, name, end);
  }
  if (dir)
    g_dir_close (dir);
  return r;
}

/* The size a fresh handshake on the device's socket announces. */
static int
served_size (const char *sock, uint64_t *size, char *err, size_t errlen)
{
  struct mloop_nbd_export x;
  int fd;

  if (mloop_nbd_connect_unix (sock, 1, &fd, &x, err, errlen) == -1)
    return -1;
  close (fd);
  *size = x.size;
  return 0;
}

/* The number of planned restarts the device's supervisor has finished,
 * and why the last failed (NULL if it did not; the caller frees it).
 */
static unsigned
handovers (const struct mloop_device_state *s, char **error)
{
  struct mloop_device_state now;
  unsigned n;

  *error = NULL;
  if (mloop_state_load (s->dir, &now) == -1)
    return 0;
  n = now.handovers;
  *error = g_steal_pointer (&now.handover_error);
  mloop_state_clear (&now);
  return n;
}

/* nbdkit 1.32 keeps the size each connection negotiated: only new
 * connections, to a new server, see the new size.  The supervisor
 * starts one and hands the kernel connections to it (SIGUSR1); this
 * waits until it says the handover is over.  Only then may the kernel
 * be told the new size: since Linux 6.9 that freezes the queue under
 * the lock the supervisor's reconnect takes, so told earlier, the kernel
 * would wait for requests that wait for the reconnect, until they fail.
 */
static int
restart_server (const struct mloop_device_state *s, char *err, size_t errlen)
{
  g_autofree char *error = NULL;
  unsigned before;

  if (!s->service_kept && (s->supervisor_pid <= 0 ||
                           !mloop_server_running (s->supervisor_pid, s->dir)))
    return mloop_fail (err, errlen, "the %s server is restarted to take a "
                       "new size, but the device has no running supervisor",
                       mloop_state_server_name (s));
  before = handovers (s, &error);
  if (s->service_kept) {
    if (mloop_service_restart (s->dir, err, errlen) == -1)
      return -1;
  }
  else if (kill (s->supervisor_pid, SIGUSR1) == -1)
    return mloop_fail (err, errlen, "SIGUSR1 to the supervisor (pid %d): %s",
                       (int) s->supervisor_pid, strerror (errno));
  for (unsigned waited = 0; waited < SERVER_TIMEOUT_MS;
       waited += SERVER_POLL_MS) {
    g_usleep (SERVER_POLL_MS * 1000);
    g_clear_pointer (&error, g_free);
    if (handovers (s, &error) == before)
      continue;
    if (error)
      return mloop_fail (err, errlen, "restarting the %s server failed: %s "
                         "(see %s)", mloop_state_server_name (s), error,
                         MLOOP_DIR_SUPERVISOR_LOG);
    return 0;
  }
  return mloop_fail (err, errlen, "%s did not restart the %s server within "
                     "%u s (see %s)", s->service_kept ? "mloopd"
                     : "the supervisor", mloop_state_server_name (s),
                     SERVER_TIMEOUT_MS / 1000, MLOOP_DIR_SUPERVISOR_LOG);
}

/* Asks the server to serve the image's size as it is now: mloop-server
 * re-reads it on SIGHUP; for nbdkit the supervisor restarts the server.
 */
static int
ask_server (const struct mloop_device_state *s, const char *sock,
            char *err, size_t errlen)
{
  /* Inside mloopd: mloopd is asked, as for a restart. */
  if (s->server_in_process)
    return restart_server (s, err, errlen);
  if (s->server->resizes_on_sighup) {
    if (!mloop_server_running (s->server_pid, sock))
      return mloop_fail (err, errlen, "the server (pid %d) is not running",
                         (int) s->server_pid);
    if (kill (s->server_pid, SIGHUP) == -1)
      return mloop_fail (err, errlen, "SIGHUP to the server (pid %d): %s",
                         (int) s->server_pid, strerror (errno));
    return 0;
  }
  return restart_server (s, err, errlen);
}

/* Makes the server serve SIZE bytes and waits until a new handshake
 * announces them.  Every request checked after that is checked against
 * the new size (mloop-server's size is one atomic variable; a restarted
 * nbdkit knows no other).
 */
static int
server_take_size (const struct mloop_device_state *s, uint64_t size,
                  char *err, size_t errlen)
{
  g_autofree char *sock = mloop_state_path (s, MLOOP_DIR_SOCKET);
  uint64_t now = 0;
  char why[512] = "";

  /* A fresh handshake may announce the new size while older
   * connections keep the one they negotiated: nbdkit's do, when the
   * plugin's store followed a resize made elsewhere.  Those need the
   * restart all the same.
   */
  if (served_size (sock, &now, why, sizeof why) == 0 && now == size &&
      (s->server->resizes_on_sighup || size == s->size))
    return 0;
  if (ask_server (s, sock, err, errlen) == -1)
    return -1;
  for (unsigned waited = 0; waited < SERVER_TIMEOUT_MS;
       waited += SERVER_POLL_MS) {
    g_usleep (SERVER_POLL_MS * 1000);
    /* During nbdkit's restart the socket is briefly absent: go on. */
    if (served_size (sock, &now, why, sizeof why) == 0 && now == size)
      return 0;
  }
  return mloop_fail (err, errlen, "the server still serves %" PRIu64
                     " bytes, not %" PRIu64 ", after %u s (%s; see %s)",
                     now, size, SERVER_TIMEOUT_MS / 1000,
                     why[0] ? why : "its log",
                     MLOOP_DIR_SERVER_LOG);
}

static int
kernel_take_size (const struct mloop_device_state *s, uint64_t size,
                  char *err, size_t errlen)
{
  char why[512];

  if (mloop_nbd_netlink_set_size (s->index, mloop_state_backend (s), size,
                                  why, sizeof why) < 0)
    return mloop_fail (err, errlen, "/dev/nbd%d: %s", s->index, why);
  return 0;
}

/* Makes the image SIZE bytes when it is not that already.  E is NULL
 * when the image was not opened: it has the size already.
 */
static int
set_image_size (struct mloop_engine *e, uint64_t size, char *err,
                size_t errlen)
{
  if (e == NULL || mloop_engine_size (e) == size)
    return 0;
  return mloop_engine_set_size (e, size, err, errlen) < 0 ? -1 : 0;
}

/* set_image_size, then closes the image (if *OPENED) before the server
 * is asked for the new size: an RBD image open for writing here is a
 * watcher on it, which a restarted server (nbdkit's resize) takes for a
 * live writer and refuses the image.
 */
static int
set_size_and_close (struct mloop_engine *e, bool *opened, uint64_t size,
                    char *err, size_t errlen)
{
  int r = set_image_size (*opened ? e : NULL, size, err, errlen);

  if (*opened)
    mloop_engine_close (e);
  *opened = false;
  return r;
}

/* Everything that can refuse, before anything changes.  Returns the
 * device's new size in *SIZE: WANT with HAVE_SIZE, else SERVED when not
 * 0, else the image's; opens the image into E (*OPENED) when that is
 * needed.
 */
static int
check_request (const struct mloop_device_state *s, bool have_size,
               uint64_t want, uint64_t served, struct mloop_engine *e,
               bool *opened, uint64_t *size, char *err, size_t errlen)
{
  g_autofree char *mnt = NULL;
  uint64_t image_size;

  if (s->transport == MLOOP_TRANSPORT_UBLK)
    return mloop_fail (err, errlen, "/dev/ublkb%d: resizing a ublk device "
                       "is not supported (Linux 6.12's ublk driver cannot "
                       "change a live device's size); detach it and attach "
                       "it again", s->index);
  if (s->remote)
    return mloop_fail (err, errlen, "/dev/nbd%d is a remote export (%s): its "
                       "size is its server's; detach and attach it again "
                       "after that server changed it", s->index, s->file);
  if (s->offset || s->sizelimit)
    return mloop_fail (err, errlen, "/dev/nbd%d serves a window of %s "
                       "(--offset/--sizelimit): resizing one is not "
                       "supported; detach it and attach the new window",
                       s->index, s->file);
  if (geteuid () != 0)
    return mloop_fail (err, errlen, "resize needs root: the kernel's NBD "
                       "netlink interface needs CAP_SYS_ADMIN");
  if (served && !have_size)
    image_size = served;
  else {
    if (open_image (s, have_size, e, err, errlen) == -1)
      return -1;
    *opened = true;
    if (have_size && mloop_engine_info (e)->is_block_device)
      return mloop_fail (err, errlen, "--size: %s is a block device; resize "
                         "it, then run mloop resize without --size", s->file);
    image_size = mloop_engine_size (e);
  }
  *size = have_size ? want : image_size;
  if (*size == 0)
    return mloop_fail (err, errlen, "%s: a device of 0 bytes is not "
                       "possible", have_size ? "--size" : s->file);
  if (have_size && *size % s->block_size)
    return mloop_fail (err, errlen, "--size %" PRIu64 ": not a multiple of "
                       "the device's block size %u", *size, s->block_size);
  if (have_size && *size < image_size &&
      check_no_data_past (e, *size, s->file, err, errlen) == -1)
    return -1;
  if (*size < s->size) {
    g_autofree char *dev = g_strdup_printf ("/dev/nbd%d", s->index);

    mnt = mloop_device_mount_point (dev);
    if (mnt)
      return mloop_fail (err, errlen, "/dev/nbd%d is mounted on %s: shrinking "
                         "a mounted device is refused; unmount it first",
                         s->index, mnt);
    if (check_partitions (s->index, *size, err, errlen) == -1)
      return -1;
  }
  return 0;
}

/* Makes the server serve SIZE: asks it (RESTART NULL: `mloop resize`),
 * or, for the supervisor following a size its server announces already,
 * nothing for mloop-server (its size is one variable, read by every
 * connection) and RESTART for nbdkit (whose older connections keep the
 * size they negotiated; the supervisor cannot signal itself).
 */
static int
server_step (const struct mloop_device_state *s, uint64_t size,
             const struct mloop_restart *restart, char *err,
             size_t errlen)
{
  if (restart == NULL)
    return server_take_size (s, size, err, errlen);
  if (s->server->resizes_on_sighup)
    return 0;
  return restart->fn (restart->data, err, errlen);
}

/* The resize, under the device's lock (see check_request for SERVED,
 * server_step for RESTART).
 */
static int
resize_locked (struct mloop_device_state *s, bool have_size, uint64_t want,
               uint64_t served, const struct mloop_restart *restart,
               char *err, size_t errlen)
{
  uint64_t size = 0;
  g_autofree char *name = mloop_state_device_name (s);
  struct mloop_engine image;
  bool opened = false;
  int r;
  char why[512];

  r = check_request (s, have_size, want, served, &image, &opened, &size,
                     err, errlen);
  if (r == 0 && size > s->size)
    /* Growing: the server before the kernel, which sends nothing past
     * the old end until it knows the new one.
     */
    r = (set_size_and_close (&image, &opened, size, err, errlen) == 0 &&
         server_step (s, size, restart, err, errlen) == 0 &&
         kernel_take_size (s, size, err, errlen) == 0) ? 0 : -1;
  else if (r == 0)
    /* Shrinking (or the same size): the kernel first.  Requests it sent
     * before it knew still find the old size in the image and the server.
     */
    r = (kernel_take_size (s, size, err, errlen) == 0 &&
         set_size_and_close (&image, &opened, size, err, errlen) == 0 &&
         server_step (s, size, restart, err, errlen) == 0) ? 0 : -1;
  if (opened)
    mloop_engine_close (&image);
  if (r == 0 && mloop_device_open_for_partition_scan (s->index, why,
                                                      sizeof why) == -1)
    r = mloop_fail (err, errlen, "resized, but re-reading the partitions "
                    "failed: %s", why);
  /* --no-partscan: that open read the table the new size marked. */
  if (r == 0 && !s->partscan &&
      mloop_partitions_drop (name, why, sizeof why) == -1)
    r = mloop_fail (err, errlen, "resized, but dropping the partitions "
                    "failed: %s", why);
  if (r == 0) {
    s->size = size;
    r = mloop_state_save (s, err, errlen);
  }
  return r;
}

int
mloop_resize (struct mloop_device_state *s, bool have_size,
              uint64_t want, char *err, size_t errlen)
{
  int lock, r;

  err[0] = '\0';
  /* Its name may now be another file: only its servers reach it. */
  if (s->held_image)
    return mloop_fail (err, errlen, "%s was attached for its owner through "
                       "mloop's D-Bus service, from a descriptor: its image "
                       "is not reached by name", mloop_state_image_name (s));
  /* Under the device's lock: no detach of it meanwhile, and its
   * supervisor does not hand the kernel connections checked against the
   * old size (its heal takes the lock too).
   */
  lock = mloop_state_lock_device (s->dir, true);
  if (lock == -1)
    return mloop_fail (err, errlen, "cannot lock %s: %s", s->dir,
                       strerror (errno));
  r = resize_locked (s, have_size, want, 0, NULL, err, errlen);
  mloop_state_unlock (lock);
  return r;
}

int
mloop_resize_follow (const char *dir, const struct mloop_restart *restart,
                     uint64_t *old_size, uint64_t *new_size,
                     char *err, size_t errlen)
{
  struct mloop_device_state s;
  g_autofree char *sock = g_build_filename (dir, MLOOP_DIR_SOCKET, NULL);
  uint64_t served;
  char why[512];
  int lock, r;

  err[0] = '\0';
  /* A server restarting or not yet up: the next look. */
  if (served_size (sock, &served, why, sizeof why) == -1)
    return 0;
  /* Never waits: a detach holding the lock waits for our caller. */
  lock = mloop_state_lock_device (dir, false);
  if (lock == -1)
    return errno == EWOULDBLOCK ? 0
      : mloop_fail (err, errlen, "cannot lock %s: %s", dir, strerror (errno));
  /* No state: attach has not recorded the device yet. */
  if (mloop_state_load (dir, &s) == -1) {
    mloop_state_unlock (lock);
    return 0;
  }
  r = 0;
  if (served != s.size) {
    *old_size = s.size;
    *new_size = served;
    r = resize_locked (&s, false, 0, served, restart, err, errlen) == 0
      ? 1 : -1;
  }
  mloop_state_clear (&s);
  mloop_state_unlock (lock);
  return r;
}
