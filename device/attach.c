/* mloop — attaching an image as /dev/nbdN and detaching it again. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "errmsg.h"
#include "attach.h"
#include "held_image.h"
#include "autoclear.h"
#include "block_queue.h"
#include "device_owner.h"
#include "nbd_connect.h"
#include "nbd_netlink.h"
#include "nbd_proto.h"
#include "nbd_receivers.h"
#include "nbd_sysfs.h"
#include "overlay_file.h"
#include "partitions.h"
#include "resident_service.h"
#include "store_name.h"
#include "ublk_device.h"

/* TCG guests start nbdkit slowly: be patient before calling it failed. */
#define SERVER_START_TIMEOUT_MS 60000
#define SERVER_STOP_TIMEOUT_MS 10000
/* A supervisor's stop outlasts its server's (it waits as long, then
 * kills it) and its overlay witness's last sync after that: killed
 * first, it would take a failed sync's report with it.
 */
#define SUPERVISOR_STOP_TIMEOUT_MS (3 * SERVER_STOP_TIMEOUT_MS)
/* Where --overlay temp makes its overlays without $TMPDIR, as qemu's
 * -snapshot does: on disk, unlike /tmp and /run on many systems, since
 * an overlay holds every block the device writes.  The tmpfiles.d rule
 * (systemd/mloop-tmpfiles.conf) sweeps what a reboot leaves there, by
 * the directories' prefix.
 */
#define MLOOP_TEMPORARY_OVERLAY_DIR "/var/tmp"
#define MLOOP_TEMPORARY_OVERLAY_PREFIX "mloop-overlay-"

int
mloop_device_index (const char *name, bool *ublk)
{
  const char *n = g_str_has_prefix (name, "/dev/") ? name + 5 : name;
  const char *digits;
  char *end;
  long n_index;

  *ublk = g_str_has_prefix (n, "ublkb");
  digits = *ublk ? n + 5 : g_str_has_prefix (n, "nbd") ? n + 3 : NULL;
  if (digits == NULL || !g_ascii_isdigit (digits[0]))
    return -1;
  n_index = strtol (digits, &end, 10);
  return *end || n_index > INT_MAX ? -1 : (int) n_index;
}

static bool
device_exists (int index)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/nbd%d", index);

  return g_file_test (path, G_FILE_TEST_IS_DIR);
}

/* Whether a mount of type FSTYPE with options OPTIONS (as
 * /proc/self/mounts shows them) may be taken at its source's word when
 * that names device DEV: a FUSE file system's source is whatever its
 * mounter said (fusermount lets any user say "/dev/nbd3"), so only
 * root's, and the device's owner's, are.  Else a user could make anyone's
 * device look mounted, and its detach refused, for as long as they like.
 */
static bool
source_trusted (const char *fstype, const char *options, const char *dev)
{
  g_auto (GStrv) opts = NULL;
  struct stat st;

  if (strcmp (fstype, "fuse") != 0 && !g_str_has_prefix (fstype, "fuse."))
    return true;
  opts = g_strsplit (options, ",", -1);
  for (char **o = opts; *o; o++) {
    guint64 uid;

    if (!g_str_has_prefix (*o, "user_id=") ||
        !g_ascii_string_to_unsigned (*o + 8, 10, 0, G_MAXUINT32, &uid, NULL))
      continue;
    return uid == 0 || (stat (dev, &st) == 0 && st.st_uid == uid);
  }
  return false;
}

char *
mloop_device_mount_point (const char *dev)
{
  g_autofree char *text = NULL;
  g_auto (GStrv) lines = NULL;

  if (!g_file_get_contents ("/proc/self/mounts", &text, NULL, NULL))
    return NULL;
  lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l; l++) {
    g_auto (GStrv) f = g_strsplit (*l, " ", 5);
    const char *rest;

    if (g_strv_length (f) < 4 || !g_str_has_prefix (f[0], dev))
      continue;
    /* /dev/nbd1 must not match /dev/nbd12; /dev/nbd1p2 must (ublkb too). */
    rest = f[0] + strlen (dev);
    if ((*rest == '\0' || (*rest == 'p' && g_ascii_isdigit (rest[1]))) &&
        source_trusted (f[2], f[3], dev))
      return g_strdup (f[1]);
  }
  return NULL;
}

/* Opens the image the way the server will, to name a missing or
 * unreadable file before any process is started.
 */
static int
check_image (const char *file, bool read_only, struct stat *st,
             char *err, size_t errlen)
{
  int fd = open (file, (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);

  if (fd == -1 && !read_only && (errno == EROFS || errno == EACCES))
    return mloop_fail (err, errlen, "%s: %s (use --read-only to attach it "
                 "read-only)", file, strerror (errno));
  if (fd == -1)
    return mloop_fail (err, errlen, "%s: %s", file, strerror (errno));
  if (fstat (fd, st) == -1 || !(S_ISREG (st->st_mode) ||
                                S_ISBLK (st->st_mode))) {
    close (fd);
    return mloop_fail (err, errlen, "%s: not a regular file or block device",
                 file);
  }
  close (fd);
  return 0;
}

/* The image REQ passes as a descriptor (held_image.h): a regular file,
 * opened for reading (and writing, unless the attach is read-only) by
 * whoever asked, on a file system that stores data.  A descriptor
 * opened with O_PATH proves no right to the file's data and is refused.
 */
static int
check_image_fd (const struct mloop_attach_request *req, struct stat *st,
                char *err, size_t errlen)
{
  int flags = fcntl (req->image_fd, F_GETFL);
  const char *pseudo;
  struct statx sx;
  unsigned mounter;

  if (flags == -1)
    return mloop_fail (err, errlen, "%s: the descriptor passed is not open: "
                       "%s", req->file, strerror (errno));
  if (mloop_held_image_label_check (req->file, err, errlen) == -1)
    return -1;
  /* Which file system, asking it nothing (AT_STATX_DONT_SYNC: FUSE
   * answers from what it holds), before any look that would wait on a
   * user's FUSE server for as long as they like: the attach holds up
   * every other caller's meanwhile (held_image.h).
   */
  if (statx (req->image_fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC,
             STATX_TYPE | STATX_MNT_ID, &sx) == -1)
    return mloop_fail (err, errlen, "%s: cannot look at the file the "
                       "descriptor passed is open on: %s", req->file,
                       strerror (errno));
  if (!S_ISREG (sx.stx_mode))
    return mloop_fail (err, errlen, "%s: not a regular file", req->file);
  switch (mloop_held_image_mount (req->caller_pid,
                                  (sx.stx_mask & STATX_MNT_ID)
                                  ? sx.stx_mnt_id : 0,
                                  sx.stx_dev_major, sx.stx_dev_minor,
                                  &mounter)) {
  case MLOOP_HELD_MOUNT_USERS_FUSE:
    return mloop_fail (err, errlen, "%s: on a FUSE file system uid %d "
                       "mounted, whose server the service would wait on: "
                       "copy the image to a disk's file system", req->file,
                       (int) mounter);
  case MLOOP_HELD_MOUNT_USERS_OVERLAY:
    return mloop_fail (err, errlen, "%s: on an overlay file system, and the "
                       "calling process is in a user namespace of its own, "
                       "where the overlay's layers may be a FUSE file system "
                       "whose server the service would wait on, or a "
                       "memory's: copy the image to a disk's file system",
                       req->file);
  case MLOOP_HELD_MOUNT_UNSEEN:
    return mloop_fail (err, errlen, "%s: on a file system the calling "
                       "process has no mount of (unmounted since the file "
                       "was opened, or a memfd's), whose server the "
                       "service could wait on: copy the image to a disk's "
                       "file system", req->file);
  case MLOOP_HELD_MOUNT_TOO_MANY:
    return mloop_fail (err, errlen, "%s: the image's mount is not within "
                       "the first %u MiB of the calling process's mounts "
                       "(its mountinfo, a mount's line at most %u KiB), "
                       "as much as the service reads", req->file,
                       MLOOP_HELD_MOUNTINFO_MAX >> 20,
                       MLOOP_HELD_MOUNTINFO_LINE_MAX >> 10);
  case MLOOP_HELD_MOUNT_SEEN:
    break;
  }
  if (fstat (req->image_fd, st) == -1)
    return mloop_fail (err, errlen, "%s: cannot look at the file the "
                       "descriptor passed is open on: %s", req->file,
                       strerror (errno));
  if ((flags & O_PATH) || (flags & O_ACCMODE) == O_WRONLY)
    return mloop_fail (err, errlen, "%s: the descriptor passed was not "
                       "opened for reading", req->file);
  if (!req->read_only && (flags & O_ACCMODE) != O_RDWR)
    return mloop_fail (err, errlen, "%s: the descriptor passed was opened "
                       "read-only: attach it read-only", req->file);
  if (!S_ISREG (st->st_mode))
    return mloop_fail (err, errlen, "%s: not a regular file", req->file);
  if ((pseudo = mloop_held_image_pseudo_fs (req->image_fd)) != NULL)
    return mloop_fail (err, errlen, "%s: on %s, a pseudo file system: not "
                       "a disk image", req->file, pseudo);
  if ((pseudo = mloop_held_image_memory_fs (req->image_fd)) != NULL)
    return mloop_fail (err, errlen, "%s: on %s, in memory, which the "
                       "device's server would pay for, not you: copy the "
                       "image to a disk's file system", req->file, pseudo);
  if (req->overlay || req->transport != MLOOP_CHOOSE_NBD)
    return mloop_fail (err, errlen, "%s: an image passed as a descriptor is "
                       "attached over NBD without an overlay", req->file);
  return 0;
}

/* The directory temporary overlays are made in: $TMPDIR when set,
 * its symlinks resolved (checked and used, the directory they lead to
 * now, whatever they are changed to later).
 */
static char *
temporary_overlay_dir (void)
{
  const char *tmpdir = g_getenv ("TMPDIR");
  char *resolved;

  if (tmpdir == NULL || *tmpdir == '\0')
    return g_strdup (MLOOP_TEMPORARY_OVERLAY_DIR);
  resolved = realpath (tmpdir, NULL);
  if (resolved == NULL)
    /* Named as given in the refusal that follows. */
    return g_canonicalize_filename (tmpdir, NULL);
  return resolved;
}

/* Whether only trusted users may rename entries in DIR, where a
 * temporary overlay's private directory goes, and in each directory
 * above it (DIR itself could be swapped there): else one could put a
 * symlink in place of one of them between the private directory's
 * making and the overlay's, and root would make the overlay, and
 * remove it at detach, wherever it points.  Trusted: root and the
 * caller own them; others may write one only when it is sticky (as
 * /tmp), which keeps them to their own entries.
 */
static int
check_temporary_overlay_dir (const char *dir, char *err, size_t errlen)
{
  g_autofree char *at = g_strdup (dir);
  struct stat st;

  if (stat (dir, &st) == -1)
    return mloop_fail (err, errlen, "cannot make a temporary overlay in %s: "
                       "%s", dir, strerror (errno));
  for (;;) {
    char *up;

    if (stat (at, &st) == -1)
      return mloop_fail (err, errlen, "cannot make a temporary overlay in "
                         "%s: %s: %s", dir, at, strerror (errno));
    if (st.st_uid != 0 && st.st_uid != geteuid ())
      return mloop_fail (err, errlen, "cannot make a temporary overlay in "
                         "%s: %s: it belongs to uid %u, who could swap the "
                         "overlay's private directory there (set TMPDIR to "
                         "a directory of root's)", dir, at,
                         (unsigned) st.st_uid);
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
      return mloop_fail (err, errlen, "cannot make a temporary overlay in "
                         "%s: %s: other users may write it and it is not "
                         "sticky, so one could swap the overlay's private "
                         "directory there (set TMPDIR to a sticky directory "
                         "or one only root may write)", dir, at);
    if (strcmp (at, "/") == 0 || strchr (at, '/') == NULL)
      return 0;
    up = g_path_get_dirname (at);
    g_free (at);
    at = up;
  }
}

/* The overlay's absolute path for --overlay WHAT: WHAT made absolute,
 * or for MLOOP_OVERLAY_TEMPORARY a new private directory in $TMPDIR or
 * /var/tmp with the overlay to be made in it.  NULL with ERR on failure.
 */
static char *
overlay_path (const char *what, const char *image, char *err, size_t errlen)
{
  g_autofree char *base = NULL;
  g_autofree char *dir = NULL;
  g_autofree char *parent = NULL;

  if (strcmp (what, MLOOP_OVERLAY_TEMPORARY) != 0)
    return g_canonicalize_filename (what, NULL);
  base = g_path_get_basename (image);
  parent = temporary_overlay_dir ();
  if (check_temporary_overlay_dir (parent, err, errlen) == -1)
    return NULL;
  dir = g_strdup_printf ("%s/" MLOOP_TEMPORARY_OVERLAY_PREFIX "%s-XXXXXX",
                         parent, base);
  if (g_mkdtemp_full (dir, 0700) == NULL) {
    mloop_fail (err, errlen, "cannot make a temporary overlay in %s: %s",
                parent, strerror (errno));
    return NULL;
  }
  return g_build_filename (dir, "overlay", NULL);
}

/* Whether the window REQ asks for overlaps device S's, both of one file
 * of ST's size.  The new window is taken at its largest (a size limit
 * the server rounds down only shrinks it).
 */
static bool
windows_overlap (const struct mloop_attach_request *req,
                 const struct stat *st, const struct mloop_device_state *s)
{
  uint64_t file_size = st->st_size > 0 ? (uint64_t) st->st_size : 0;
  uint64_t end = req->offset < file_size ? file_size : req->offset + 1;

  if (req->sizelimit && req->sizelimit < end - req->offset)
    end = req->offset + req->sizelimit;
  /* A block device's st_size is 0: its windows end at the limit, or
   * never.
   */
  if (S_ISBLK (st->st_mode))
    end = req->sizelimit ? req->offset + req->sizelimit : UINT64_MAX;
  return req->offset < s->offset + s->size && s->offset < end;
}

/* Whether names A and B, neither a local file's, name one image. */
static bool
same_image (const char *a, const char *b)
{
  g_autofree char *ia = mloop_image_identity (a);
  g_autofree char *ib = mloop_image_identity (b);

  return strcmp (ia, ib) == 0;
}

/* Whether device S (attached, or being attached when CLAIMED) holds
 * FILE (with identity ST), or the remote URI FILE when ST is NULL: for
 * a local file, a window of it overlapping REQ's.
 */
static int
conflicts (const struct mloop_attach_request *req, const char *file,
           const char *overlay, const struct stat *st,
           const struct mloop_device_state *s, bool claimed, char *err,
           size_t errlen)
{
  g_autofree char *dev = NULL;

  if (overlay && s->overlay && strcmp (overlay, s->overlay) == 0) {
    dev = claimed ? g_strdup ("a device (an attach in progress)")
      : mloop_state_device_path (s);
    return mloop_fail (err, errlen, "overlay %s is in use by %s", overlay,
                       dev);
  }
  /* A base under overlays is only read: other overlays and read-only
   * devices may share it.
   */
  if ((overlay && (s->overlay || s->read_only)) ||
      (s->overlay && req->read_only))
    return 0;
  /* Another user's read-only device of an image they passed to
   * mloop-dbus never writes it, so cannot corrupt what this attach
   * writes: refused, any user could keep anyone's readable image, root's
   * too, from being attached for as long as they liked.
   */
  if (s->held_image && s->read_only && s->owner != req->owner)
    return 0;
  if (st ? !(mloop_state_image_is (s, st) && windows_overlap (req, st, s))
      : !same_image (s->file, file))
    return 0;
  dev = claimed ? g_strdup ("a device (an attach in progress)")
    : mloop_state_device_path (s);
  if (s->offset || s->sizelimit || req->offset || req->sizelimit)
    return mloop_fail (err, errlen, "%s is already attached to %s "
                       "at offset %" G_GUINT64_FORMAT ", size %"
                       G_GUINT64_FORMAT ": windows of one file must not "
                       "overlap", mloop_state_image_name (s), dev, s->offset,
                       s->size);
  return mloop_fail (err, errlen, "%s is already attached to %s",
                     mloop_state_image_name (s), dev);
}

/* Whether FILE, or a window of it overlapping REQ's, is attached
 * already or being attached (see conflicts).
 */
static int
already_attached (const struct mloop_attach_request *req, const char *file,
                  const char *overlay, const struct stat *st, char *err,
                  size_t errlen)
{
  size_t n, nc;
  struct mloop_device_state *list = mloop_state_list (&n);
  struct mloop_device_state *claims = mloop_state_list_claims (&nc);
  int r = 0;

  for (size_t i = 0; i < n && r == 0; i++)
    r = conflicts (req, file, overlay, st, &list[i], false, err, errlen);
  for (size_t i = 0; i < nc && r == 0; i++)
    r = conflicts (req, file, overlay, st, &claims[i], true, err, errlen);
  mloop_state_free_list (list, n);
  mloop_state_free_list (claims, nc);
  return r;
}

/* The kernel device's logical block size: --block-size, or by default
 * the image's own.  mloop's servers advertise any request size as
 * allowed (minimum 1) and the O_DIRECT alignment as preferred: the
 * device takes that alignment, as loop does with direct IO, and a
 * smaller --block-size is refused, since every write would then be a
 * read-modify-write in the server.  A remote server may be anyone's:
 * there the advertised minimum, at least 512, as nbd-client does.
 */
static int
choose_block_size (const struct mloop_attach_request *req, bool remote,
                   const struct mloop_nbd_export *x, uint32_t *bs,
                   char *err, size_t errlen)
{
  uint32_t need = remote ? x->min_block : x->preferred_block;
  uint32_t min = need > 512 ? need : 512;

  if (req->block_size == 0) {
    *bs = min;
    return 0;
  }
  if (req->block_size < min)
    return mloop_fail (err, errlen, "--block-size %u is below the image's "
                 "block size %u", req->block_size, min);
  *bs = req->block_size;
  return 0;
}

/* Stops the supervisor first, so it does not restart the server, then
 * the server (the supervisor stops it too; this covers a supervisor that
 * was killed).  A device mloopd keeps is dropped by mloopd instead.
 */
static void
stop_processes (const struct mloop_device_state *s)
{
  char err[512];

  /* A drop refused (mloopd gone, or restarted and not keeping it yet)
   * leaves the server to the stop below.
   */
  if (s->service_kept)
    mloop_service_drop (s->dir, err, sizeof err);
  if (s->supervisor_pid > 0)
    mloop_server_stop (s->supervisor_pid, s->dir, SUPERVISOR_STOP_TIMEOUT_MS);
  /* Every server's command line names a file in the directory (its
   * socket; mloop-ublk's device file); one inside mloopd went with the
   * drop.
   */
  if (s->server_pid > 0 && !s->server_in_process)
    mloop_server_stop (s->server_pid, s->dir, SERVER_STOP_TIMEOUT_MS);
}

static unsigned
default_connections (void)
{
  unsigned n = g_get_num_processors ();

  return n > MLOOP_MAX_CONNECTIONS ? MLOOP_MAX_CONNECTIONS : n;
}

/* Opens and negotiates the connections to hand to the kernel: fills FDS
 * and *X, returns how many were opened, or -1 with ERR (FDS all closed).
 */
struct opener {
  int (*open) (const struct opener *o, int *fds,
               struct mloop_nbd_export *x, char *err, size_t errlen);
  const char *socket_path;                      /* attach_local's */
  const struct mloop_nbd_address *address;      /* attach_remote's */
  unsigned n;
  bool read_only;
  /* attach_local's, served inside mloopd: the connections its keep's
   * answer brought, used by the first open (taken: n_fds 0).
   */
  struct mloop_service_kept *given;
};

/* How long the kernel may take to start reading every connection, and
 * how many times a device with a connection left unread is connected
 * again (see nbd_receivers.h).
 */
#define RECEIVERS_SETTLE_MS  500
#define RECEIVERS_TIMEOUT_MS 5000
#define RECEIVERS_ATTEMPTS   16
/* How many devices an attach tries that another attach connects or makes
 * first.
 */
#define BUSY_ATTEMPTS        64

/* Hands N negotiated sockets to the kernel as one device, /dev/nbdWANT
 * (-1: the kernel's choice).  The kernel takes its own references: FDS
 * are closed here either way.  A negative errno with ERR on failure
 * (-EBUSY: WANT is connected, or held open).
 */
static int
hand_to_kernel (int want, int *fds, unsigned n,
                const struct mloop_nbd_export *x,
                uint32_t block_size, unsigned timeout, unsigned dead_timeout,
                const char *backend, int *index, char *err, size_t errlen)
{
  /* The dead-connection timeout makes IO wait, instead of failing at
   * once, when every connection is gone: time for a restarted server
   * to be reconnected (NBD_CMD_RECONFIGURE).
   */
  struct mloop_nbd_device_config dc = {
    .index = want, .size = x->size, .block_size = block_size,
    .server_flags = x->flags, .timeout = timeout,
    .dead_conn_timeout = dead_timeout,
    .backend = backend, .fds = fds, .nr_fds = n,
  };
  char why[512];
  int r;

  r = mloop_nbd_netlink_connect (&dc, index, why, sizeof why);
  mloop_nbd_close_all (fds, n);
  if (r < 0)
    mloop_fail (err, errlen, "%s", why);
  return r < 0 ? r : 0;
}

/* The lowest index from FROM on that names no device yet: connected
 * there, the kernel makes a new device, whose node udev makes root's.
 */
static int
absent_index (int from)
{
  for (int index = MAX (from, 0); index < INT_MAX; index++) {
    g_autofree char *sys = g_strdup_printf ("/sys/block/nbd%d", index);

    if (!g_file_test (sys, G_FILE_TEST_EXISTS))
      return index;
  }
  return -1;
}

/* Claims INDEX for this attach (device_state.h): the claim's
 * descriptor, -1 when none could be made (this attach goes on without
 * one: the kernel still refuses a second connect), or -2 when another
 * attach holds it.
 */
static int
try_claim (int index)
{
  int fd = mloop_state_claim_index (index);

  return fd == -1 && errno == EWOULDBLOCK ? -2 : fd;
}

/* The device to connect next (device_owner.h says why its node must be
 * root's first), with *CLAIM held on it: the one REQ asks for (no
 * claim), or the lowest idle one from FROM on, or a new one at an index
 * no device has.  Never the kernel's choice (-1): the kernel would take
 * any unconfigured device, whatever its node's owner, such as a user's
 * device released since the idle ones were given back to root.
 *
 * Attaches at the same time would choose the same lowest device: each
 * claims down one scan's list, and asks the kernel only about a device
 * it holds the claim of, so another's claimed device costs a lock, not
 * a netlink question (sixteen attaches at once spent most of their time
 * choosing).  -2 with ERR when the one asked for cannot be given back
 * to root, or every candidate was claimed.
 */
static int
choose_index (const struct mloop_attach_request *req, int from, int *claimed,
              char *err, size_t errlen)
{
  g_autofree char *name = NULL;
  g_autoptr (GArray) candidates = NULL;
  int fd;

  *claimed = -1;
  if (req->index >= 0) {
    (void) mloop_device_owner_reclaim_idle (req->index);
    name = g_strdup_printf ("nbd%d", req->index);
    if (!mloop_device_owner_is_root (name)) {
      mloop_fail (err, errlen, "/dev/%s is not root's and the disk group's "
                  "only, and could not be made so: no image is connected "
                  "to it", name);
      return -2;
    }
    return req->index;
  }
  candidates = mloop_device_owner_candidates (from);
  for (guint i = 0; i < candidates->len; i++) {
    const int index = g_array_index (candidates, int, i);

    if ((fd = try_claim (index)) == -2)
      continue;
    if (mloop_device_owner_idle (index)) {
      *claimed = fd;
      return index;
    }
    mloop_state_release_claim (index, fd);
  }
  /* A new device: the kernel makes it at an index no device has. */
  for (int index = absent_index (from), tries = 0; index >= 0 &&
       tries < BUSY_ATTEMPTS; index = absent_index (index + 1), tries++)
    if ((fd = try_claim (index)) != -2) {
      *claimed = fd;
      return index;
    }
  mloop_fail (err, errlen, "every free nbd device is being attached by "
              "another mloop: try again");
  return -2;
}

/* After the connect: whether device INDEX's node is still root's, which
 * only a concurrent attach and release of a user's device there could
 * have undone.  If not, disconnects it, with ERR.
 */
static int
check_connected_node (int index, char *err, size_t errlen)
{
  g_autofree char *name = g_strdup_printf ("nbd%d", index);
  char why[512];

  if (mloop_device_owner_is_root (name))
    return 0;
  mloop_nbd_netlink_disconnect (index, why, sizeof why);
  return mloop_fail (err, errlen, "/dev/%s was given to a user while it "
                     "was being connected: attach again", name);
}

/* The requests in flight per hardware queue (per connection).  The
 * kernel times a request from when it is sent; a request the server has
 * not started on would be timed while it waits behind the others, so a
 * slow disk would look like a dead connection.  Requests beyond the
 * depth wait in the block layer, untimed.
 */
static unsigned
queue_depth (const struct mloop_device_state *s)
{
  return s->server ? s->server->requests_at_once : MLOOP_NBD_QUEUE_DEPTH;
}

/* What the device needs once connected: its queue settings, then its
 * partitions read (or dropped, --no-partscan).  Set on every attach: the
 * settings outlive the connection.
 */
static int
prepare_device (const struct mloop_attach_request *req,
                const struct mloop_device_state *s, int index,
                const struct mloop_nbd_export *x, char *err, size_t errlen)
{
  const struct mloop_queue_plan plan = {
    .depth = queue_depth (s), .server_max_request = x->max_block,
    .options = req->queue_options,
  };
  g_autofree char *name = g_strdup_printf ("nbd%d", index);

  if (mloop_queue_configure (name, &plan, err, errlen) == -1)
    return -1;
  mloop_step_done (req->steps, "queue settings");
  if (mloop_partitions_scan (name, err, errlen) == -1)
    return -1;
  mloop_step_done (req->steps, "partition scan");
  /* The kernel would read the table on the first open anyway (the size
   * it was given marks it for reading), so --no-partscan reads it, which
   * clears the mark, and drops what it found.
   */
  return req->no_partscan ? mloop_partitions_drop (name, err, errlen) : 0;
}

/* Waits up to TIMEOUT_MS for the kernel to let go of /dev/nbdINDEX, so
 * that it can be connected again (a fixed --index would be busy).
 */
static void
wait_disconnected (int index, unsigned timeout_ms)
{
  bool connected = true;
  char why[512];

  for (unsigned waited = 0; waited < timeout_ms; waited += 20) {
    if (mloop_nbd_netlink_connected (index, &connected, why,
                                     sizeof why) < 0 || !connected)
      return;
    g_usleep (20000);
  }
}

/* Connects the device from the sockets O opens and records it in S.
 * BACKEND names the image in sysfs.  A device one of whose connections
 * the kernel does not read (Linux 6.1's workqueue rescuer) is
 * disconnected and connected again with new sockets: by then the worker
 * pool has the kworkers it lacked.
 */
static int
connect_kernel (const struct mloop_attach_request *req,
                const struct opener *o, const char *backend,
                struct mloop_device_state *s, char *err, size_t errlen)
{
  struct mloop_nbd_export x = { 0 };
  int fds[MLOOP_MAX_CONNECTIONS];
  char why[512];
  int n, index = -1, from = 0, want, r;
  unsigned busy = 0;

  for (unsigned attempt = 1; ; attempt++) {
    int claim;

    want = choose_index (req, from, &claim, err, errlen);
    if (want == -2)
      return -1;
    mloop_step_done (req->steps, "device chosen");
    n = o->open (o, fds, &x, err, errlen);
    if (n < 0) {
      mloop_state_release_claim (want, claim);
      return -1;
    }
    mloop_step_done (req->steps, "handshakes");
    if (o->read_only)
      x.flags |= NBD_FLAG_READ_ONLY;    /* the kernel then refuses writes */
    if (choose_block_size (req, s->remote, &x, &s->block_size, err, errlen) == -1) {
      mloop_nbd_close_all (fds, (unsigned) n);
      mloop_state_release_claim (want, claim);
      return -1;
    }
    r = hand_to_kernel (want, fds, (unsigned) n, &x, s->block_size,
                        s->timeout, s->dead_timeout, backend, &index, err,
                        errlen);
    /* Connected, the device is no longer idle to the next chooser. */
    mloop_state_release_claim (want, claim);
    /* Another attach took the device we chose (an idle one, or made the
     * new one first): the next one.
     */
    if ((r == -EBUSY || r == -EEXIST) && req->index < 0 && want >= 0 &&
        busy++ < BUSY_ATTEMPTS) {
      from = want + 1;
      attempt--;
      continue;
    }
    if (r < 0 || check_connected_node (index, err, errlen) == -1)
      return -1;
    mloop_step_done (req->steps, "netlink connect");
    if (attempt == RECEIVERS_ATTEMPTS ||
        mloop_nbd_receivers_all_running (index, (unsigned) n,
                                         RECEIVERS_SETTLE_MS,
                                         RECEIVERS_TIMEOUT_MS)) {
      mloop_step_done (req->steps, "receive workers");
      break;
    }
    /* Nothing was written yet: start again from nothing. */
    if (mloop_nbd_netlink_disconnect (index, why, sizeof why) < 0)
      return mloop_fail (err, errlen, "/dev/nbd%d: %s", index, why);
    mloop_nbd_receivers_wait_gone (index, RECEIVERS_TIMEOUT_MS);
    wait_disconnected (index, RECEIVERS_TIMEOUT_MS);
    mloop_step_done (req->steps, "a receive worker missing: connect again");
  }

  if (prepare_device (req, s, index, &x, err, errlen) == -1) {
    mloop_nbd_netlink_disconnect (index, why, sizeof why);
    return -1;
  }
  s->index = index;
  s->size = x.size;
  s->read_only = (x.flags & NBD_FLAG_READ_ONLY) != 0;
  s->connections = (unsigned) n;
  s->export_flags = x.flags;
  s->partscan = !req->no_partscan;
  if (mloop_state_save (s, err, errlen) == -1 ||
      (req->autoclear && mloop_autoclear_enable (s, err, errlen) == -1)) {
    mloop_nbd_netlink_disconnect (index, why, sizeof why);
    return -1;
  }
  mloop_step_done (req->steps, "state saved");
  return 0;
}

static int
open_local (const struct opener *o, int *fds, struct mloop_nbd_export *x,
            char *err, size_t errlen)
{
  struct mloop_service_kept *given = o->given;

  /* Made by mloopd, in transmission already: no handshake.  A second
   * try (another attach took the device chosen) negotiates anew.
   */
  if (given && given->n_fds == o->n) {
    memcpy (fds, given->fds, o->n * sizeof *fds);
    *x = given->export;
    given->n_fds = 0;
    return (int) o->n;
  }
  if (mloop_nbd_connect_unix (o->socket_path, o->n, fds, x, err,
                              errlen) == -1)
    return -1;
  return (int) o->n;
}

static int
open_remote (const struct opener *o, int *fds, struct mloop_nbd_export *x,
             char *err, size_t errlen)
{
  return mloop_nbd_connect (o->address, o->n, false, fds, x, err, errlen);
}

static unsigned
wanted_connections (const struct mloop_attach_request *req)
{
  return req->connections ? req->connections : default_connections ();
}

/* An RBD image's server fails a request the cluster has not answered
 * in the device's dead timeout, as the device's IO fails when its server
 * stays dead that long (an unreachable cluster is a dead server to the
 * device).  The kernel's request timeout must be longer than that: timed
 * out first, the kernel would send the request again on another
 * connection, where it waits again, before the server's EIO came, and
 * the IO would wait for ever.
 */
#define RBD_REQUEST_TIMEOUT_MARGIN 5

/* The device's request and dead-connection timeouts, and its server's
 * IO timeout (0: none).
 */
static unsigned
settle_timeouts (const struct mloop_attach_request *req, const char *file,
                 struct mloop_device_state *s)
{
  unsigned io_timeout = 0;

  s->timeout = req->timeout ? req->timeout : MLOOP_DEFAULT_TIMEOUT;
  s->dead_timeout = req->dead_timeout ? req->dead_timeout
    : s->remote ? MLOOP_REMOTE_DEAD_TIMEOUT : s->timeout;
  if (!s->remote && mloop_is_rbd_name (file)) {
    io_timeout = s->dead_timeout;
    s->timeout = MAX (s->timeout, io_timeout + RBD_REQUEST_TIMEOUT_MARGIN);
  }
  return io_timeout;
}

/* A local image: its supervisor starts its server on a private socket.
 * On failure stops them; the caller removes the directory.
 */
static int
attach_local (const struct mloop_attach_request *req, const char *file,
              struct mloop_device_state *s, char *err, size_t errlen)
{
  g_autofree char *sock = mloop_state_path (s, MLOOP_DIR_SOCKET);
  g_autofree char *pid_file = mloop_state_path (s, MLOOP_DIR_SERVER_PID);
  g_autofree char *log_file = mloop_state_path (s, MLOOP_DIR_SERVER_LOG);
  g_autofree char *stats_file = mloop_state_path (s, MLOOP_DIR_STATS);
  g_autofree char *lock_record = mloop_is_rbd_name (file)
    ? mloop_state_path (s, MLOOP_DIR_RBD_LOCK) : NULL;
  const unsigned io_timeout = settle_timeouts (req, file, s);
  struct mloop_server_spec spec = {
    .kind = s->server,
    .image = req->has_image_fd ? MLOOP_HELD_IMAGE_PATH : file,
    .offset = req->offset,
    .sizelimit = req->sizelimit, .overlay = s->overlay,
    .lock_record = lock_record, .socket_path = sock,
    .pid_file = pid_file, .log_file = log_file, .stats_file = stats_file,
    .threads = req->threads,
    .read_only = req->read_only,
    .io_timeout = io_timeout,
  };
  struct mloop_service_kept kept = { .n_fds = 0 };
  const struct opener o = {
    .open = open_local, .socket_path = sock, .n = wanted_connections (req),
    .given = &kept,
  };

  int r;

  s->threads = req->threads ? req->threads : 4;
  /* mloopd keeps it where mloopd listens; not an image held open by the
   * caller, whose descriptor mloopd does not take.
   */
  r = req->has_image_fd ? 0 : mloop_service_keep (&spec, s->dir, o.n, &kept,
                                                  err, errlen);
  if (r == -1)
    return -1;
  s->service_kept = r == 1;
  s->server_pid = kept.server;
  s->server_in_process = kept.in_process;
  if (!s->service_kept) {
    mloop_held_image_set (req->has_image_fd ? req->image_fd : -1);
    r = mloop_supervisor_start (&spec, s->dir, SERVER_START_TIMEOUT_MS,
                                &s->supervisor_pid, &s->server_pid, err,
                                errlen);
    mloop_held_image_set (-1);
    if (r == -1)
      return -1;
  }
  mloop_step_done (req->steps, "server start");
  r = connect_kernel (req, &o, s->backend, s, err, errlen);
  /* Those a failure left untaken. */
  mloop_nbd_close_all (kept.fds, kept.n_fds);
  if (r == -1) {
    stop_processes (s);
    return -1;
  }
  return 0;
}

/* A remote export (nbd://HOST:PORT/NAME): no server of ours, and as many
 * connections as asked only if the server advertises multi-conn.  Its
 * keeper (mloopd's where mloopd listens, else its own supervisor)
 * starts first, listening for the kernel's announcements of dead
 * connections, so none is missed; it reconnects them once the device's
 * state exists.  On failure stops it; the caller removes the directory.
 */
static int
attach_remote (const struct mloop_attach_request *req, const char *uri,
               struct mloop_device_state *s, char *err, size_t errlen)
{
  struct mloop_nbd_address a;
  const struct opener o = {
    .open = open_remote, .address = &a, .n = wanted_connections (req),
    .read_only = req->read_only,
  };
  int r;

  if (mloop_nbd_address_parse (uri, MLOOP_NBD_ADDRESS_URI, &a,
                               err, errlen) == -1)
    return -1;
  settle_timeouts (req, uri, s);
  r = mloop_service_keep_remote (uri, s->dir, err, errlen);
  s->service_kept = r == 1;
  if (r == 0)
    r = mloop_supervisor_start_remote (uri, s->dir, SERVER_START_TIMEOUT_MS,
                                       &s->supervisor_pid, err, errlen);
  else if (r == 1)
    r = 0;
  if (r == 0)
    mloop_step_done (req->steps, "supervisor start");
  if (r == 0 &&
      (r = connect_kernel (req, &o, s->backend, s, err, errlen)) == -1)
    stop_processes (s);
  mloop_nbd_address_clear (&a);
  return r;
}

/* Settles REQ's choice of transport: 1 for ublk, 0 for NBD, or -1 with
 * ERR when ublk was asked for and cannot serve.  AUTO takes NBD for what
 * only NBD does (a remote export, NBD's own options) and where the
 * kernel has no ublk.
 */
static int
choose_ublk (const struct mloop_attach_request *req, char *err,
             size_t errlen)
{
  char why[512];

  switch (req->transport) {
  case MLOOP_CHOOSE_AUTO:
    if (!req->ublk_index)
      return !mloop_ublk_refuses (req, why, sizeof why) &&
        mloop_ublk_available (why, sizeof why);
    /* --device /dev/ublkbN: nothing else would do */
    /* fall through */
  case MLOOP_CHOOSE_UBLK:
    if (mloop_ublk_refuses (req, err, errlen) ||
        !mloop_ublk_available (err, errlen))
      return -1;
    return 1;
  case MLOOP_CHOOSE_NBD:
  default:
    if (req->index >= 0 && req->ublk_index) {
      mloop_fail (err, errlen, "--device /dev/ublkb%d is a ublk device; "
                  "the nbd transport makes /dev/nbdN", req->index);
      return -1;
    }
    return 0;
  }
}

/* The most REQ's window of a file with identity ST can hold: the size
 * a claim records, before the server has said what it serves (at least
 * 1, so that an empty window still overlaps what starts where it does).
 */
static uint64_t
window_size_at_most (const struct mloop_attach_request *req,
                     const struct stat *st)
{
  uint64_t file_size = S_ISBLK (st->st_mode) ? UINT64_MAX
    : st->st_size > 0 ? (uint64_t) st->st_size : 0;
  uint64_t size = file_size > req->offset ? file_size - req->offset : 1;

  return req->sizelimit && req->sizelimit < size ? req->sizelimit : size;
}

/* Under the state lock: refuses FILE if it is attached, or being
 * attached, already; else makes OUT's directory, takes its lock
 * (*DEVICE_LOCK) and records in it what OUT will attach, so the next
 * attach sees it.  ST is FILE's identity, NULL for a remote URI or an
 * RBD image; REMOTE says which.
 */
static int
claim (const struct mloop_attach_request *req, const char *file,
       const char *overlay, const struct stat *st, bool remote,
       struct mloop_device_state *out, int *device_lock, char *err,
       size_t errlen)
{
  *device_lock = -1;
  if (already_attached (req, file, overlay, st, err, errlen) == -1 ||
      mloop_state_create (out, err, errlen) == -1)
    return -1;
  *device_lock = mloop_state_lock_device (out->dir, true);
  if (*device_lock == -1) {
    mloop_fail (err, errlen, "cannot lock %s: %s", out->dir,
                strerror (errno));
    mloop_state_remove (out->dir);
    mloop_state_clear (out);
    return -1;
  }
  out->file = g_strdup (file);
  out->backend = mloop_state_new_backend (file);
  out->held_image = req->has_image_fd;
  out->label = req->has_image_fd ? g_strdup (req->file) : NULL;
  out->owner = req->owner;
  out->person = req->person ? req->person : req->owner;
  out->overlay = g_strdup (overlay);
  out->overlay_temporary = overlay && req->overlay &&
                           strcmp (req->overlay, MLOOP_OVERLAY_TEMPORARY) == 0;
  out->remote = remote;
  if (st) {
    out->file_dev = st->st_dev;
    out->file_ino = st->st_ino;
    out->file_rdev = S_ISBLK (st->st_mode) ? st->st_rdev : 0;
    out->offset = req->offset;
    out->sizelimit = req->sizelimit;
    out->size = window_size_at_most (req, st);
  }
  if (mloop_state_save_claim (out, err, errlen) == -1) {
    mloop_state_remove (out->dir);
    mloop_state_clear (out);
    return -1;
  }
  return 0;
}

/* Hands device S, just attached for OWNER, to them (device_owner.h);
 * if it cannot be, detaches it.  Attached for root, a node a user's
 * device left theirs (an autoclear device goes without a detach) is
 * taken back.
 */
static int
settle_owner (struct mloop_device_state *s, uid_t owner, char *err,
              size_t errlen)
{
  g_autofree char *name = mloop_state_device_name (s);
  g_autofree char *node = mloop_state_device_path (s);
  struct stat st;
  char why[512];

  if (owner == 0 && (stat (node, &st) == -1 || st.st_uid == 0))
    return 0;
  if (mloop_device_owner_set (name, owner, err, errlen) == 0)
    return 0;
  mloop_device_owner_set (name, 0, why, sizeof why);
  if (mloop_nbd_netlink_disconnect (s->index, why, sizeof why) == 0)
    stop_processes (s);
  return -1;
}

int
mloop_attach (const struct mloop_attach_request *req,
              struct mloop_device_state *out, char *err, size_t errlen)
{
  g_autofree char *file = NULL, *overlay = NULL;
  struct stat st;
  bool busy = false;
  bool remote = !req->has_image_fd && strstr (req->file, "://") != NULL;
  bool rbd = !req->has_image_fd && mloop_is_rbd_name (req->file);
  char why[512];
  bool temporary;
  int lock, device_lock, r, ublk;

  memset (out, 0, sizeof *out);
  out->index = -1;
  if (geteuid () != 0)
    return mloop_fail (err, errlen, "attach needs root: the kernel's NBD "
                       "netlink interface and ublk's control device need "
                       "CAP_SYS_ADMIN");
  if (remote) {
    struct mloop_nbd_address a;

    /* A bad URI is the cause to name, whatever the kernel lacks. */
    if (mloop_nbd_address_parse (req->file, MLOOP_NBD_ADDRESS_URI, &a,
                                 err, errlen) == -1)
      return -1;
    mloop_nbd_address_clear (&a);
    file = g_strdup (req->file);
  }
  else if (req->has_image_fd) {
    if (check_image_fd (req, &st, err, errlen) == -1)
      return -1;
    file = mloop_state_held_token ();
  }
  else if (rbd) {
    /* The server names what else is wrong. */
    if (mloop_rbd_name_check (req->file, err, errlen) == -1 ||
        (file = mloop_rbd_name_pinned (req->file, err, errlen)) == NULL)
      return -1;
  }
  else {
    /* Under an overlay the image is only read. */
    if (check_image (req->file, req->read_only || req->overlay, &st, err,
                     errlen) == -1)
      return -1;
    file = realpath (req->file, NULL);
    if (file == NULL)
      return mloop_fail (err, errlen, "%s: %s", req->file, strerror (errno));
  }
  if (req->overlay && (remote || rbd))
    return mloop_fail (err, errlen, "--overlay needs a local image, not "
                       "%s", req->file);
  if (req->overlay && req->read_only)
    return mloop_fail (err, errlen, "--overlay and --read-only: a device "
                       "with an overlay is for writing");
  if (req->overlay && (overlay = overlay_path (req->overlay, file, err,
                                               errlen)) == NULL)
    return -1;
  temporary = overlay && strcmp (req->overlay, MLOOP_OVERLAY_TEMPORARY) == 0;
  if ((ublk = choose_ublk (req, err, errlen)) == -1)
    goto refused;
  /* What the claim records says which server, or the transport. */
  if (ublk)
    out->transport = MLOOP_TRANSPORT_UBLK;
  else if (!remote)
    out->server = req->server ? req->server : mloop_server_kind_default ();
  if (!ublk && mloop_nbd_netlink_available (err, errlen) < 0)
    goto refused;
  if (!ublk && req->index >= 0) {
    if (!device_exists (req->index)) {
      mloop_fail (err, errlen, "/dev/nbd%d does not exist (the nbd module "
                  "makes nbds_max devices)", req->index);
      goto refused;
    }
    if (mloop_nbd_netlink_connected (req->index, &busy, why, sizeof why) == 0
        && busy) {
      mloop_fail (err, errlen, "/dev/nbd%d is busy (already connected)",
                  req->index);
      goto refused;
    }
  }

  mloop_step_done (req->steps, "checks");
  lock = mloop_state_lock (err, errlen);
  if (lock == -1)
    goto refused;
  mloop_step_done (req->steps, "state lock");
  r = claim (req, file, overlay, remote || rbd ? NULL : &st, remote, out,
             &device_lock, err, errlen);
  /* The rest under the device's own lock only, so attaches of other
   * images run meanwhile; but a ublk attach keeps the state lock: a ublk
   * detach tells whether a device number is still its own from what is
   * recorded (mloop_ublk_index_reused), and an attach in progress has
   * recorded no number yet.
   */
  if (!ublk) {
    mloop_state_unlock (lock);
    lock = -1;
  }
  if (r == 0) {
    mloop_step_done (req->steps, "claim");
    if (remote)
      r = attach_remote (req, file, out, err, errlen);
    else if (ublk)
      r = mloop_ublk_attach (req, file, out, err, errlen);
    else
      r = attach_local (req, file, out, err, errlen);
    if (r == 0 && !ublk)
      r = settle_owner (out, req->owner, err, errlen);
    if (r < 0) {
      mloop_state_remove_temporary_overlay (out);
      mloop_state_remove (out->dir);
      mloop_state_clear (out);
    }
  }
  else if (temporary)
    mloop_remove_temporary_overlay_dir (overlay);
  mloop_state_unlock (device_lock);
  mloop_state_unlock (lock);
  return r;

 refused:
  /* Nothing made yet but the temporary overlay's directory. */
  if (temporary)
    mloop_remove_temporary_overlay_dir (overlay);
  return -1;
}

/* What the kernel has at NBD device S's index now.  S's state may have
 * outlived its device (an autoclear device the kernel let go before its
 * supervisor looked, or whose supervisor is gone), and the index been
 * given since to the next attach, anyone's, or connected by another
 * tool.
 */
enum at_index {
  /* S's device, still configured: S's to let go. */
  AT_INDEX_OWN,
  /* No device: the kernel let S's go (autoclear), and nothing is there
   * yet.  Nothing to disconnect: the next attach, root's say, may
   * connect one there at any moment, which is not S's to touch.
   */
  AT_INDEX_NONE,
  /* A device of another backend, which the kernel shows while a
   * device connected with one is configured: another attach's, or
   * another tool's netlink connect that named one of its own.
   */
  AT_INDEX_OTHER,
  /* A device connected with no backend (or an empty one): not S's
   * either, since every attach names its backend and the kernel shows
   * it until the last reference to that configuration goes.  Another
   * tool's connect (qemu-nbd -c, nbd-client), or a descriptor open on
   * the idle device.
   */
  AT_INDEX_UNNAMED,
};

/* What is at S's index, and in *SHOWN (g_free it; when not NULL) the
 * backend the kernel shows there, NULL for none.
 */
static enum at_index
at_index_showing (const struct mloop_device_state *s, char **shown)
{
  g_autofree char *backend = mloop_nbd_sysfs_backend ("/sys/block",
                                                      s->index);
  bool connected = false;
  char why[512];

  if (shown)
    *shown = NULL;
  /* An empty backend is a netlink connect that named none. */
  if (backend && *backend) {
    const bool own = strcmp (backend, mloop_state_backend (s)) == 0;

    if (shown)
      *shown = g_steal_pointer (&backend);
    return own ? AT_INDEX_OWN : AT_INDEX_OTHER;
  }
  if (mloop_nbd_netlink_connected (s->index, &connected, why,
                                   sizeof why) == 0 && connected)
    return AT_INDEX_UNNAMED;
  return AT_INDEX_NONE;
}

static enum at_index
at_index (const struct mloop_device_state *s)
{
  return at_index_showing (s, NULL);
}

/* After S's device went, with anything or nothing at its index (the
 * kernel showing backend SHOWN there, or none: NULL): the node given
 * back to root if it is still the one S gave its owner, as the
 * supervisor would have done, unless the device there is another mloop
 * device of that owner's (its attach gave the node back to root before
 * it connected, then to its owner).  Another tool's device leaves the
 * node as S left it.  Anyone else's node (root may have given it to
 * someone for that device) is left alone.  The node is read before the
 * states: an attach saves its state before it gives its node away.
 */
static void
give_back_node (const struct mloop_device_state *s, const char *shown)
{
  g_autofree char *name = mloop_state_device_name (s);
  g_autofree char *node = mloop_state_device_path (s);
  struct stat st;
  char why[512];

  if (s->owner != 0 && stat (node, &st) == 0 && st.st_uid == s->owner &&
      !mloop_state_nbd_device_of (s->index, shown, s->owner))
    mloop_device_owner_set (name, 0, why, sizeof why);
}

/* NBD device S's side in the kernel, before its server goes: its node
 * given back to root, its partitions dropped, the device disconnected.
 * 0, or -1 with ERR.
 */
static int
let_kernel_go (const struct mloop_device_state *s, char *err, size_t errlen)
{
  g_autofree char *name = mloop_state_device_name (s);
  char why[512];

  /* Taken from its user before the image goes (device_owner.h). */
  if (s->owner && mloop_device_owner_set (name, 0, why, sizeof why) == -1)
    return mloop_fail (err, errlen, "%s", why);
  /* The kernel keeps a disconnected device's partitions (its size
   * becomes 0, its table stays): drop them while they can be read.
   * Best effort: a partition still open by someone keeps its node, as
   * with a loop device.
   */
  mloop_partitions_drop (name, why, sizeof why);
  /* Tell the kernel first: it sends NBD_CMD_DISC on every connection
   * after the requests in flight, so the server sees clean goodbyes.
   * Only while it is still S's: an autoclear device the kernel let go
   * meanwhile leaves its index to the next attach, anyone's.
   */
  if (at_index (s) == AT_INDEX_OWN &&
      mloop_nbd_netlink_disconnect (s->index, why, sizeof why) < 0)
    return mloop_fail (err, errlen, "/dev/nbd%d: %s", s->index, why);
  return 0;
}

int
mloop_detach (const struct mloop_device_state *s, char *err, size_t errlen)
{
  g_autofree char *dev = mloop_state_device_path (s);
  g_autofree char *mnt = mloop_device_mount_point (dev);
  g_autofree char *state = mloop_state_path (s, MLOOP_DIR_STATE);
  g_autofree char *shown = NULL;
  int lock = -1, device_lock, witness = -1, r = 0;

  /* Only S's own device's mount: a stale state's index may hold
   * another's device by now, mounted or not, which stays.
   */
  if (mnt && (s->transport == MLOOP_TRANSPORT_UBLK ||
              at_index (s) == AT_INDEX_OWN))
    return mloop_fail (err, errlen, "%s is mounted on %s: unmount it "
                 "first", dev, mnt);
  /* A ublk detach under the state lock too: see mloop_attach. */
  if (s->transport == MLOOP_TRANSPORT_UBLK &&
      (lock = mloop_state_lock (err, errlen)) == -1)
    return -1;
  /* The device's own lock: no other detach, resize or reconnect of it
   * meanwhile.  Whoever held it before may have detached it (autoclear,
   * another mloop detach): then there is nothing left to do.
   */
  device_lock = mloop_state_lock_device (s->dir, true);
  if (device_lock == -1 && errno != ENOENT) {
    mloop_state_unlock (lock);
    return mloop_fail (err, errlen, "cannot lock %s: %s", s->dir,
                       strerror (errno));
  }
  if (device_lock == -1 || !g_file_test (state, G_FILE_TEST_EXISTS)) {
    mloop_state_unlock (device_lock);
    mloop_state_unlock (lock);
    return 0;
  }
  /* The supervisor syncs its own witness as the server stops, but a
   * server stuck in a sync outlives the supervisor's time to stop.
   */
  if (!s->overlay_temporary)
    witness = mloop_overlay_witness_open (s->overlay);
  if (s->transport == MLOOP_TRANSPORT_UBLK) {
    /* The device goes with its server: nothing to disconnect first.
     * The state stays when the device could not be deleted, so detach
     * can be tried again.
     */
    r = mloop_ublk_detach (s, err, errlen);
    mloop_overlay_witness_close (witness);
    if (r == 0) {
      mloop_state_remove_temporary_overlay (s);
      mloop_state_remove (s->dir);
    }
    mloop_state_unlock (device_lock);
    mloop_state_unlock (lock);
    return r;
  }
  /* The device there is another's now: neither its node, nor its
   * partitions, nor its connection are this state's to touch, only what
   * the state started.
   */
  switch (at_index_showing (s, &shown)) {
  case AT_INDEX_OWN:
    if (let_kernel_go (s, err, errlen) == -1) {
      mloop_overlay_witness_close (witness);
      mloop_state_unlock (device_lock);
      return -1;
    }
    break;
  case AT_INDEX_NONE:
  case AT_INDEX_UNNAMED:
  case AT_INDEX_OTHER:
    give_back_node (s, shown);
    break;
  }
  stop_processes (s);
  /* Every process that wrote the overlay is gone (stop_processes waits
   * for the server's death): a failure one took with it is marked.
   */
  mloop_overlay_witness_close (witness);
  mloop_state_remove_temporary_overlay (s);
  mloop_state_remove (s->dir);
  mloop_state_unlock (device_lock);
  return 0;
}

/* Whether WHAT names a device, "nbdN" or "ublkbN", with or without
 * "/dev/": then *NAME is it without "/dev/".
 */
static bool
device_name (const char *what, const char **name)
{
  bool ublk;

  if (mloop_device_index (what, &ublk) < 0)
    return false;
  *name = g_str_has_prefix (what, "/dev/") ? what + 5 : what;
  return true;
}

/* How device S serves the image FILE names (a realpath, a URI or an
 * RBD name), FILE_ST the identity of the file it names (NULL when it
 * has none): SERVES_FILE, the file itself, by identity: a held image so
 * only, since its name was only its caller's label; a local file too
 * (a block device by its number), as attach refuses it under any name,
 * a hard link or a bind mount (mloop_state_image_is): else root's
 * device of a file, named otherwise, was missed for another user's
 * read-only one of it (conflicts).  SERVES_NAME: the name it recorded,
 * which a file renamed away since leaves to whatever is put there.
 * Resolves no name.
 */
enum serves { SERVES_NOT, SERVES_NAME, SERVES_FILE };

static enum serves
serves_image (const struct mloop_device_state *s, const char *file,
              const struct stat *file_st)
{
  if (s->held_image)
    return file_st != NULL && mloop_state_image_is (s, file_st)
      ? SERVES_FILE : SERVES_NOT;
  /* An RBD image's state records no identity (0, 0). */
  if (file_st != NULL && (s->file_ino != 0 || s->file_rdev != 0) &&
      !mloop_is_rbd_name (s->file) && mloop_state_image_is (s, file_st))
    return SERVES_FILE;
  return same_image (s->file, file) ? SERVES_NAME : SERVES_NOT;
}

/* The device named NAME (device_name's) when NAME is set, else the one
 * serving FILE (serves_image's), into *OUT; WHAT is the caller's word
 * for it, for the error.  FILE may be served by OWNER's device and by
 * other users' read-only ones (conflicts): OWNER's is the one found.
 * Of those, one serving the file itself before one that only recorded
 * its name: a file attached, renamed away, and another put at its name
 * and attached too leaves two devices recording one name, and the
 * first's detach or resize (--size truncates its file) was not asked
 * for.  Of those alike, the one still at its index: a user's stale
 * state (an autoclear device the kernel let go, its supervisor not yet
 * looking, or gone) and their device attached at that index since both
 * name it, and the stale one, older, came first in the list: their
 * detach of the device removed the state and left the device.
 */
static int
find_device (const char *name, const char *file, const struct stat *file_st,
             uid_t owner, const char *what, struct mloop_device_state *out,
             char *err, size_t errlen)
{
  struct mloop_device_state *list;
  size_t n;
  ssize_t found = -1;
  int best = -1;

  list = mloop_state_list (&n);
  for (size_t i = 0; i < n; i++) {
    g_autofree char *dev = mloop_state_device_name (&list[i]);
    enum serves how = name
      ? (strcmp (dev, name) == 0 ? SERVES_FILE : SERVES_NOT)
      : serves_image (&list[i], file, file_st);
    int rank;

    if (how == SERVES_NOT)
      continue;
    rank = (list[i].owner == owner) * 4 + (how == SERVES_FILE) * 2;
    if (rank + 1 <= best)
      continue;
    rank += list[i].transport == MLOOP_TRANSPORT_UBLK ||
      at_index (&list[i]) == AT_INDEX_OWN;
    if (rank > best) {
      found = (ssize_t) i;
      best = rank;
    }
  }
  if (found != -1) {
    *out = list[found];
    memset (&list[found], 0, sizeof list[found]);
  }
  mloop_state_free_list (list, n);
  if (found == -1)
    return mloop_fail (err, errlen, "%s is not attached by mloop", what);
  return 0;
}

int
mloop_lookup_for (const char *what, uid_t owner,
                  struct mloop_device_state *out, char *err, size_t errlen)
{
  const char *name = NULL;
  g_autofree char *file = NULL;
  struct stat st;

  if (device_name (what, &name))
    return find_device (name, NULL, NULL, owner, what, out, err, errlen);
  if (strstr (what, "://") || mloop_is_rbd_name (what))
    return find_device (NULL, what, NULL, owner, what, out, err, errlen);
  file = realpath (what, NULL);
  if (file == NULL)
    return mloop_fail (err, errlen, "%s: not an nbd or ublk device, and %s",
                       what, strerror (errno));
  return find_device (NULL, file, stat (file, &st) == 0 ? &st : NULL,
                      owner, what, out, err, errlen);
}

int
mloop_lookup (const char *what, struct mloop_device_state *out,
              char *err, size_t errlen)
{
  return mloop_lookup_for (what, geteuid (), out, err, errlen);
}

int
mloop_lookup_resolved (const char *path, const struct stat *st,
                       uid_t owner, struct mloop_device_state *out,
                       char *err, size_t errlen)
{
  return find_device (NULL, path, st, owner, path, out, err, errlen);
}

static pid_t
read_pid (const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autofree char *text = NULL;

  return g_file_get_contents (path, &text, NULL, NULL) ? atoi (text) : 0;
}

static bool
has_file (const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);

  return g_file_test (path, G_FILE_TEST_EXISTS);
}

int
mloop_cleanup_incomplete (void)
{
  g_auto (GStrv) dirs = NULL;
  char err[256];
  int lock, n = 0;

  lock = mloop_state_lock (err, sizeof err);
  if (lock == -1)
    return 0;
  /* An attach in progress holds its directory's lock: whatever lacks a
   * state file and whose lock is free was abandoned (looked for again
   * under the lock: the attach may have finished since the listing).
   */
  dirs = mloop_state_list_incomplete ();
  for (char **d = dirs; *d; d++) {
    struct mloop_device_state s = { .dir = *d };
    int device_lock = mloop_state_lock_abandoned (*d);

    if (device_lock == -1)
      continue;
    struct mloop_device_state claimed;

    s.supervisor_pid = read_pid (*d, MLOOP_DIR_SUPERVISOR_PID);
    s.server_pid = read_pid (*d, MLOOP_DIR_SERVER_PID);
    s.service_kept = has_file (*d, MLOOP_DIR_KEEP);
    stop_processes (&s);
    /* The temporary overlay it made goes with it, as at detach. */
    if (mloop_state_load_claim (*d, &claimed) == 0) {
      mloop_state_remove_temporary_overlay (&claimed);
      mloop_state_clear (&claimed);
    }
    mloop_state_remove (*d);
    mloop_state_unlock (device_lock);
    n++;
  }
  /* What it gave a user it had no time to take back (device_owner.h). */
  if (n > 0)
    mloop_device_owner_reclaim_idle (0);
  mloop_state_unlock (lock);
  return n;
}
