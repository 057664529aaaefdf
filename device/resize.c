/* mloop — changing the size of an attached device while it runs. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include <glib.h>

#include "attach.h"
#include "errmsg.h"
#include "nbd_connect.h"
#include "nbd_netlink.h"
#include "partitions.h"
#include "resize.h"

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

/* The image's size as it is now. */
static int
image_size (int fd, const struct stat *st, uint64_t *size, const char *file,
            char *err, size_t errlen)
{
  if (S_ISBLK (st->st_mode)) {
    if (ioctl (fd, BLKGETSIZE64, size) == -1)
      return mloop_fail (err, errlen, "%s: BLKGETSIZE64: %s", file,
                         strerror (errno));
  }
  else
    *size = (uint64_t) st->st_size;
  return 0;
}

/* Refuses to cut off data: the first byte at or past FROM that the file
 * stores (SEEK_DATA; a filesystem without holes says every byte is data).
 */
static int
check_no_data_past (int fd, uint64_t from, uint64_t file_size,
                    const char *file, char *err, size_t errlen)
{
  off_t at;

  if (from >= file_size)
    return 0;
  at = lseek (fd, (off_t) from, SEEK_DATA);
  if (at == -1 && errno == ENXIO)
    return 0;
  if (at == -1)
    return mloop_fail (err, errlen, "%s: looking for data past byte %"
                       PRIu64 ": %s", file, from, strerror (errno));
  return mloop_fail (err, errlen, "shrinking to %" PRIu64 " bytes would cut "
                     "off data: byte %" PRIu64 " of %s is in use (the first "
                     "past the new size); nothing was changed", from,
                     (uint64_t) at, file);
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

  if (s->supervisor_pid <= 0 ||
      !mloop_server_running (s->supervisor_pid, s->dir))
    return mloop_fail (err, errlen, "the %s server is restarted to take a "
                       "new size, but the device has no running supervisor",
                       mloop_state_server_name (s));
  before = handovers (s, &error);
  if (kill (s->supervisor_pid, SIGUSR1) == -1)
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
  return mloop_fail (err, errlen, "the supervisor (pid %d) did not restart "
                     "the %s server within %u s (see %s)",
                     (int) s->supervisor_pid, mloop_state_server_name (s),
                     SERVER_TIMEOUT_MS / 1000, MLOOP_DIR_SUPERVISOR_LOG);
}

/* Asks the server to serve the image's size as it is now: mloop-server
 * re-reads it on SIGHUP; for nbdkit the supervisor restarts the server.
 */
static int
ask_server (const struct mloop_device_state *s, const char *sock,
            char *err, size_t errlen)
{
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

  if (served_size (sock, &now, why, sizeof why) == 0 && now == size)
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

  if (mloop_nbd_netlink_set_size (s->index, s->file, size, why,
                                  sizeof why) < 0)
    return mloop_fail (err, errlen, "/dev/nbd%d: %s", s->index, why);
  return 0;
}

/* Grows or truncates the image file to SIZE when it is not that already. */
static int
set_file_size (int fd, uint64_t now, uint64_t size, const char *file,
               char *err, size_t errlen)
{
  if (now != size && ftruncate (fd, (off_t) size) == -1)
    return mloop_fail (err, errlen, "%s: setting its size to %" PRIu64
                       " bytes: %s", file, size, strerror (errno));
  return 0;
}

/* Everything that can refuse, before anything changes.  Opens the image
 * into *FD and returns the device's new size in *SIZE and the image's
 * current one in *FILE_SIZE.
 */
static int
check_request (const struct mloop_device_state *s, bool have_size,
               uint64_t want, int *fd, uint64_t *size, uint64_t *file_size,
               char *err, size_t errlen)
{
  g_autofree char *mnt = NULL;
  struct stat st;

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
  *fd = open (s->file, (have_size ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (*fd == -1)
    return mloop_fail (err, errlen, "%s: %s", s->file, strerror (errno));
  if (fstat (*fd, &st) == -1 ||
      image_size (*fd, &st, file_size, s->file, err, errlen) == -1) {
    if (errno && !err[0])
      mloop_fail (err, errlen, "%s: %s", s->file, strerror (errno));
    return -1;
  }
  if (have_size && S_ISBLK (st.st_mode))
    return mloop_fail (err, errlen, "--size: %s is a block device; resize "
                       "it, then run mloop resize without --size", s->file);
  *size = have_size ? want : *file_size;
  if (*size == 0)
    return mloop_fail (err, errlen, "%s: a device of 0 bytes is not "
                       "possible", have_size ? "--size" : s->file);
  if (have_size && *size % s->block_size)
    return mloop_fail (err, errlen, "--size %" PRIu64 ": not a multiple of "
                       "the device's block size %u", *size, s->block_size);
  if (have_size && *size < *file_size &&
      check_no_data_past (*fd, *size, *file_size, s->file, err, errlen) == -1)
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

int
mloop_resize (struct mloop_device_state *s, bool have_size,
              uint64_t want, char *err, size_t errlen)
{
  uint64_t size = 0, file_size = 0;
  g_autofree char *name = mloop_state_device_name (s);
  int fd = -1, lock, r;
  char why[512];

  err[0] = '\0';
  /* Under the device's lock: no detach of it meanwhile, and its
   * supervisor does not hand the kernel connections checked against the
   * old size (its heal takes the lock too).
   */
  lock = mloop_state_lock_device (s->dir, true);
  if (lock == -1)
    return mloop_fail (err, errlen, "cannot lock %s: %s", s->dir,
                       strerror (errno));
  r = check_request (s, have_size, want, &fd, &size, &file_size, err, errlen);
  if (r == 0 && size > s->size)
    /* Growing: the server before the kernel, which sends nothing past
     * the old end until it knows the new one.
     */
    r = (set_file_size (fd, file_size, size, s->file, err, errlen) == 0 &&
         server_take_size (s, size, err, errlen) == 0 &&
         kernel_take_size (s, size, err, errlen) == 0) ? 0 : -1;
  else if (r == 0)
    /* Shrinking (or the same size): the kernel first.  Requests it sent
     * before it knew still find the old size in the file and the server.
     */
    r = (kernel_take_size (s, size, err, errlen) == 0 &&
         set_file_size (fd, file_size, size, s->file, err, errlen) == 0 &&
         server_take_size (s, size, err, errlen) == 0) ? 0 : -1;
  if (fd != -1)
    close (fd);
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
  mloop_state_unlock (lock);
  return r;
}
