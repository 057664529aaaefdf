/* mloop — attaching an image as /dev/nbdN and detaching it again.
 *
 * Attach starts a private server for the image (device_state.h says where
 * its socket lives), opens several connections, negotiates each one
 * (nbd_client.h) and hands them to the kernel (nbd_netlink.h), so the
 * device gets one hardware queue per connection.  A remote export
 * (nbd://) has no server of ours, but a supervisor all the same, which
 * reconnects the device when the remote server comes back after a
 * restart.  A local image may instead be attached through ublk
 * (ublk_device.h): no server, socket or connection.  Every step undoes the
 * earlier ones when it fails: no server, socket, directory or device is
 * left behind.  Never prints; errors are one line in ERR.
 */
#ifndef MLOOP_ATTACH_H
#define MLOOP_ATTACH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "device_state.h"
#include "steps.h"

#define MLOOP_MAX_CONNECTIONS 16
#define MLOOP_DEFAULT_TIMEOUT 30        /* seconds, like nbd-client */
/* How long a remote device's IO waits for its server to come back once
 * every connection is dead, seconds: a restart of the server, or of the
 * machine it runs on, is survived; past it IO fails with EIO.  A local
 * device waits its request timeout, since its supervisor restarts its
 * server within seconds.
 */
#define MLOOP_REMOTE_DEAD_TIMEOUT 120
/* The kernel client's requests in flight per connection
 * (drivers/block/nbd.c, tag_set.queue_depth): a remote device's depth.
 */
#define MLOOP_NBD_QUEUE_DEPTH 128

/* Which kernel driver makes the device: NBD (the default), ublk, or
 * AUTO: ublk where the kernel has it and the image is local, else NBD.
 */
enum mloop_transport_choice {
  MLOOP_CHOOSE_NBD, MLOOP_CHOOSE_UBLK, MLOOP_CHOOSE_AUTO,
};

struct mloop_attach_request {
  const char *file;
  /* With HAS_IMAGE_FD the image is the regular file open at IMAGE_FD,
   * opened by whoever asked for the attach (read-only unless opened for
   * reading and writing), served as it is open (held_image.h); FILE, an
   * absolute path, is then only its label to show, never opened nor the
   * device's identity (device_state.h).  Attached over NBD, without an
   * overlay.
   */
  bool has_image_fd;
  int image_fd;
  /* The process that passed IMAGE_FD, whose mounts tell which file
   * system it is on (held_image.h), or 0: this process's mounts.
   */
  pid_t caller_pid;
  uid_t owner;                  /* recorded as who attached it */
  /* The person OWNER is, whose devices mloop-dbus counts together
   * (device_state.h); 0: OWNER.
   */
  uid_t person;
  enum mloop_transport_choice transport;
  /* The window of FILE to attach (losetup's --offset, --sizelimit):
   * from byte OFFSET, at most SIZELIMIT bytes (0: to the end).  Windows
   * of one file that do not overlap may be attached at once.
   */
  uint64_t offset, sizelimit;
  /* A copy-on-write overlay to write to (made when absent), FILE then
   * only read and shareable with other overlay devices;
   * MLOOP_OVERLAY_TEMPORARY for one made for the device and deleted at
   * detach; NULL: none.
   */
  const char *overlay;
  /* The device asked for (--device): /dev/nbdINDEX, or /dev/ublkbINDEX
   * if UBLK_INDEX; -1 for the first free.
   */
  int index;
  bool ublk_index;
  unsigned threads;             /* server IO workers; 0 = its default */
  unsigned connections;         /* 0 = one per CPU, at most 16 */
  bool read_only;
  uint32_t block_size;          /* 0 = the export's minimum, at least 512 */
  unsigned timeout;             /* request timeout, seconds; 0 = default */
  /* Dead-connection timeout, seconds; 0 = the default: the request
   * timeout for a local image, MLOOP_REMOTE_DEAD_TIMEOUT for a remote one.
   */
  unsigned dead_timeout;
  const struct mloop_server_kind *server;      /* NULL: the default */
  bool no_partscan;             /* leave the partition table unread */
  bool autoclear;               /* detach on last close (autoclear.h) */
  /* "NAME=VALUE" queue settings (block_queue.h), NULL-terminated or NULL */
  char *const *queue_options;
  struct mloop_steps *steps;    /* each step's time (steps.h), or NULL */
};

#define MLOOP_OVERLAY_TEMPORARY "temp"

/* Attaches; on success fills *OUT (the caller clears it). */
int mloop_attach (const struct mloop_attach_request *req,
                  struct mloop_device_state *out, char *err, size_t errlen);

/* Disconnects the device, stops its server and removes its state.
 * Refuses while the device is mounted.
 */
int mloop_detach (const struct mloop_device_state *s, char *err,
                  size_t errlen);

/* Finds an attached device by "/dev/nbdN", "nbdN", "/dev/ublkbN",
 * "ublkbN" or its image's path (a local file by the file that path
 * names too, under any name of it, a held image never by its label):
 * of an image also served by other users' read-only devices, this
 * process's user's own.
 */
int mloop_lookup (const char *what, struct mloop_device_state *out,
                  char *err, size_t errlen);

/* mloop_lookup() for OWNER: of the devices WHAT may name, OWNER's
 * first.  One index can have two states, one outliving its device (an
 * autoclear device the kernel let go before its supervisor looked) and
 * the device attached there since: a caller's "/dev/nbdN" is their own
 * state's before another user's or root's.  A path is resolved here,
 * with this process's rights: give OWNER's own paths to
 * mloop_lookup_resolved.
 */
int mloop_lookup_for (const char *what, uid_t owner,
                      struct mloop_device_state *out, char *err,
                      size_t errlen);

/* Finds the device serving the image at PATH, a canonical path (a
 * realpath) whose file has the identity ST, both found by whoever asks
 * with their own rights: no name is resolved again here, so a lookup
 * run as root for a caller who is not reaches nothing the caller could
 * not (a root-only path, an automount).  Of an image served by several
 * users' devices (other users' read-only ones), OWNER's.
 */
int mloop_lookup_resolved (const char *path, const struct stat *st,
                           uid_t owner, struct mloop_device_state *out,
                           char *err, size_t errlen);

/* Stops the servers of attaches that died half-way and removes their
 * directories.  Returns how many it removed.
 */
int mloop_cleanup_incomplete (void);

/* Where DEVICE ("/dev/nbdN", "/dev/ublkbN") or one of its partitions
 * is mounted (g_free it), or NULL.  A FUSE mount naming it counts only
 * when root or DEVICE's owner made it (its source is its mounter's say).
 */
char *mloop_device_mount_point (const char *device);

/* Parses "/dev/nbdN" or "/dev/ublkbN", with or without "/dev/": N, and
 * in *UBLK which of the two; -1 when it is neither.
 */
int mloop_device_index (const char *name, bool *ublk);

#endif /* MLOOP_ATTACH_H */
