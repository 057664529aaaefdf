/* mloop — an image attached through ublk (/dev/ublkbN) instead of NBD.
 *
 * The kernel's ublk driver (ublk_drv, Linux 6.0 and later) hands each
 * request of /dev/ublkbN to a process through io_uring: no socket, no
 * server protocol.  mloop-ublk (ublk/) is that process; it creates the
 * device, serves it on the IO engine the NBD servers use, and deletes
 * it when stopped.  As with NBD, the device's mloop-supervisor starts
 * it, detached, in the device's directory (device_state.h), and starts
 * another when it dies: the device is made with ublk's user recovery, so
 * the kernel holds its IO meanwhile and gives the requests the dead one
 * had to the next (mloop-ublk --recover).  Detach stops the supervisor,
 * which stops mloop-ublk, and deletes the device itself if a killed
 * mloop-ublk left it behind.
 *
 * If none has taken the device over within the dead timeout, the
 * supervisor stops it, so that its IO fails instead of waiting for ever.
 *
 * Not yet for ublk: a remote image (NBD carries it), a chosen device
 * number, request timeouts, autoclear and resize.  Each is refused in
 * one line.  Never prints.
 */
#ifndef MLOOP_UBLK_DEVICE_H
#define MLOOP_UBLK_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <glib.h>

#include "attach.h"
#include "device_state.h"

/* The file mloop-ublk writes in the device directory: "/dev/ublkbN". */
#define MLOOP_DIR_UBLK_DEVICE "device"

/* What mloop-ublk serves, and how: the same on every (re)start. */
struct mloop_ublk_spec {
  const char *image;
  uint64_t offset, sizelimit;   /* the window served (attach.h) */
  const char *overlay;          /* copy-on-write overlay, or NULL */
  unsigned queues;              /* hardware queues */
  int id;                       /* /dev/ublkbID, or -1: the first free */
  uint32_t block_size;          /* 0: the image's */
  bool read_only;
  unsigned io_timeout;          /* an RBD image's (server_kind.h), or 0 */
};

/* Whether this kernel makes ublk devices (/dev/ublk-control exists) and
 * mloop-ublk is there; if not, ERR says why.
 */
bool mloop_ublk_available (char *err, size_t errlen);

/* Whether REQ asks for something only the NBD transport does; if so,
 * ERR names it.
 */
bool mloop_ublk_refuses (const struct mloop_attach_request *req,
                         char *err, size_t errlen);

/* mloop-ublk's command line for SPEC with its files in DIR, made
 * recoverable; with RECOVER >= 0 it takes over device RECOVER, whose
 * server died, instead of making one.  g_strfreev it.
 */
char **mloop_ublk_command (const struct mloop_ublk_spec *spec,
                           const char *dir, int recover);

/* The device mloop-ublk in DIR said it serves (its device file). */
int mloop_ublk_read_device_file (const char *dir, int *index,
                                 char *err, size_t errlen);

/* Starts FILE's supervisor in S's directory, which starts mloop-ublk,
 * and records the device in S (saved).  On failure nothing is left but
 * the directory, which the caller removes.
 */
int mloop_ublk_attach (const struct mloop_attach_request *req,
                       const char *file, struct mloop_device_state *s,
                       char *err, size_t errlen);

/* Writes back what the page cache holds for /dev/ublkbINDEX (fsync),
 * before its server is told to stop: user recovery makes its STOP_DEV
 * skip the kernel's own write-back.  mloop-ublk writes it back itself
 * at SIGTERM too; done first from outside, by the one who would
 * recover the device, a server that dies during it can be seen to.  A
 * server that dies during a flush leaves its device holding the
 * writeback for the next server, so a flush that did not watch it would
 * wait for ever.  _begin starts the flush on a thread of its own;
 * _wait returns true once it has ended, false if the server
 * SERVER_PIDFD names died first (then recover the device, or delete it,
 * which fails the writeback, and wait again or end); _end joins it and
 * returns its result, 0 or a negative errno.
 */
struct mloop_ublk_flush;
struct mloop_ublk_flush *mloop_ublk_flush_begin (int index);
bool mloop_ublk_flush_wait (struct mloop_ublk_flush *f, int server_pidfd);
int mloop_ublk_flush_end (struct mloop_ublk_flush *f);

/* Stops the supervisor and mloop-ublk (which deletes the device), or
 * deletes a device a killed one left.  The caller holds the state lock
 * and removes the directory.
 */
int mloop_ublk_detach (const struct mloop_device_state *s,
                       char *err, size_t errlen);

/* `mloop-ublk --delete INDEX`: stops device INDEX (its held IO fails)
 * and deletes it; 0 also when it is gone already.
 */
int mloop_ublk_delete (int index, char *err, size_t errlen);

/* Whether another device of ours than the one in DIR is /dev/ublkbINDEX
 * now: the kernel gives a deleted device's number to the next one.
 */
bool mloop_ublk_index_reused (const char *dir, int index);

/* Whether the kernel has the disk /dev/ublkbINDEX. */
bool mloop_ublk_device_present (int index);

#endif /* MLOOP_UBLK_DEVICE_H */
