/* mloop — what is attached: one directory per device in the runtime dir.
 *
 *   /run/mloop/              0700, root only (MLOOP_RUNTIME_DIR overrides)
 *     .lock                  flock()ed while an attach claims its image
 *     dev-XXXXXX/            one per attach, named before the device is known,
 *                            flock()ed while the device is set up, changed
 *                            or torn down (mloop_state_lock_device)
 *       sock, state, ...     the files MLOOP_DIR_* name, below
 *
 * An attach holds .lock only while it checks that its image is not
 * attached already and claims it (a "claim" file in a new directory, its
 * lock held); the rest of the attach holds only its directory's lock, so
 * attaches of different images run side by side.  A directory without
 * "state" is an attach in progress (its lock held), or one that died
 * half-way (nobody holds it); its pid files let `mloop detach --all`
 * clean that up.  Never prints.
 */
#ifndef MLOOP_DEVICE_STATE_H
#define MLOOP_DEVICE_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "server_process.h"

/* The files in a device directory:
 *   SOCKET          the server's private Unix socket
 *   SERVER_PID, SERVER_LOG, STATS   its pid, output, request counters
 *   SUPERVISOR_PID, SUPERVISOR_LOG  the supervisor's (restarts and why)
 *   STATE           a key file, written once the device is up
 *   SUPERVISOR      a key file the supervisor rewrites on each restart
 *                   and reconnect: current server pid, restarts, why,
 *                   reconnects, why, planned restarts (handovers) done
 *                   and why the last failed
 */
#define MLOOP_DIR_SOCKET "sock"
#define MLOOP_DIR_SERVER_PID "server.pid"
#define MLOOP_DIR_SERVER_LOG "server.log"
#define MLOOP_DIR_STATS "stats"
/*   RBD_LOCK        an RBD image's: its exclusive lock's holder, as its
 *                   servers record it (engine.h, lock_record) */
#define MLOOP_DIR_RBD_LOCK "rbd-lock"
#define MLOOP_DIR_SUPERVISOR_PID "supervisor.pid"
#define MLOOP_DIR_SUPERVISOR_LOG "supervisor.log"
#define MLOOP_DIR_STATE "state"
#define MLOOP_DIR_SUPERVISOR "supervisor"
/*   CLAIM           the image an attach in progress is attaching: the
 *                   state's keys as far as they are known */
#define MLOOP_DIR_CLAIM "claim"
/*   KEEP            mloopd's record of a device it keeps: the request
 *                   that began it (supervisor/keep_record.h) */
#define MLOOP_DIR_KEEP "keep"

/* How the kernel reaches the image: the NBD client over sockets to a
 * server (/dev/nbdN), or ublk_drv's io_uring commands straight to
 * mloop-ublk (/dev/ublkbN; ublk_device.h).
 */
enum mloop_transport { MLOOP_TRANSPORT_NBD, MLOOP_TRANSPORT_UBLK };

struct mloop_device_state {
  char *dir;                    /* this device's directory */
  enum mloop_transport transport;
  int index;                    /* /dev/nbdINDEX or /dev/ublkbINDEX;
                                   -1 until connected */
  /* The image, an absolute path (or a URI, an RBD name): what
   * `mloop detach FILE` looks for.
   */
  char *file;
  /* The backend identifier the kernel keeps for the device (sysfs
   * "backend"): FILE and a token, unique to this attach, since root may
   * attach one file more than once (windows of it, overlays over it).
   * The supervisor repeats it when it reconnects, and whatever asks
   * whether the device at the index is still this one compares it
   * (mloop_state_backend).  NULL in a state written before it was
   * recorded: FILE was the identifier then.
   */
  char *backend;
  /* A held image: its servers reach it through a descriptor the
   * supervisor holds (held_image.h).  FILE is then a token mloop made,
   * unique to the device, and LABEL the name its caller gave, only shown:
   * a caller's name may be anything, another user's image's included.
   */
  bool held_image;
  char *label;
  uid_t owner;                  /* who attached it (mloop's D-Bus service
                                   attaches for other users); root: 0 */
  /* The person behind OWNER, by whom mloop-dbus counts a user's devices:
   * their login uid, which every uid of theirs shares, subordinate uids
   * in a user namespace included (dbus/caller.h).  OWNER when the
   * service did not say (a state written before it was recorded too).
   */
  uid_t person;
  uint64_t file_dev, file_ino;  /* its identity, to refuse double attach */
  /* For a block device FILE, the device itself (its st_rdev), which
   * every node naming it shares; 0 for anything else.
   */
  uint64_t file_rdev;
  /* The window of FILE served (losetup's OFFSET and SIZELIMIT): from
   * byte OFFSET; SIZELIMIT as asked, 0 for none.  SIZE is what the
   * device got: the window's size.
   */
  uint64_t offset, sizelimit;
  uint64_t size;
  /* The copy-on-write overlay the device writes to, an absolute path,
   * or NULL: FILE is written.  TEMPORARY: made for this device and
   * deleted at detach.
   */
  char *overlay;
  bool overlay_temporary;
  uint32_t block_size;
  bool read_only;
  bool partscan;                /* partitions read (not --no-partscan) */
  bool autoclear;               /* detached on last close (autoclear.h) */
  unsigned connections, threads;
  unsigned timeout;             /* request timeout, s */
  /* How long IO waits for a reconnect while every connection is dead,
   * s: the request timeout for a local device, longer for a remote one
   * (its server restarts on its own time; attach.h).
   */
  unsigned dead_timeout;
  /* The export's flags as the device was given them (nbd_proto.h): a
   * remote export that comes back with others is not reconnected.
   */
  uint16_t export_flags;
  bool remote;                  /* FILE is an nbd:// URI: no server of ours */
  const struct mloop_server_kind *server;       /* NULL when remote or
                                                   ublk */
  pid_t server_pid;             /* the current one, after any restart */
  pid_t supervisor_pid;         /* 0: unsupervised, or kept by mloopd */
  bool service_kept;            /* its server kept by mloopd
                                   (resident_service.h), not by a
                                   supervisor of its own */
  bool server_in_process;       /* served inside mloopd (server_pid is
                                   mloopd's), not by a process of its own */
  unsigned restarts;            /* servers restarted by the supervisor */
  char *last_failure;           /* why the last server died, or NULL */
  unsigned reconnects;          /* connections the kernel dropped while
                                   the server lived, replaced by the
                                   supervisor */
  char *last_reconnect;         /* why the last one was dropped, or NULL */
  unsigned handovers;           /* planned restarts finished (SIGUSR1) */
  char *handover_error;         /* why the last one failed, or NULL */
};

/* What the supervisor records (DIR/supervisor). */
struct mloop_supervisor_record {
  pid_t server_pid;             /* 0 between a server and its successor */
  unsigned restarts;
  const char *last_failure;     /* NULL: none */
  unsigned reconnects;
  const char *last_reconnect;   /* NULL: none */
  unsigned handovers;
  const char *handover_error;   /* NULL: the last handover succeeded */
};

/* The runtime directory; created 0700 when missing. */
const char *mloop_runtime_dir (void);
int mloop_runtime_dir_create (char *err, size_t errlen);

/* The runtime directory's lock: held while an attach claims its image
 * (and throughout a ublk attach or detach), and while abandoned attaches
 * are cleaned up.  Returns an fd for mloop_state_unlock, or -1.
 */
int mloop_state_lock (char *err, size_t errlen);
void mloop_state_unlock (int fd);

/* Takes device directory DIR's own lock (released by mloop_state_unlock):
 * waiting for it when WAIT, else -1 with errno EWOULDBLOCK while someone
 * holds it; -1 with errno ENOENT when DIR is gone.
 */
int mloop_state_lock_device (const char *dir, bool wait);

/* Claims NBD index INDEX among attaches choosing a device at the same
 * time: a descriptor for mloop_state_release_claim, or -1 with errno
 * EWOULDBLOCK while another attach holds it, or another errno when no
 * claim could be made.  Only a way to choose apart: the kernel still
 * refuses a second connect of one index, which is what keeps two
 * devices apart.  A claim is a locked file in the runtime directory,
 * there only while held (one a dead attach left is taken over).
 */
int mloop_state_claim_index (int index);
void mloop_state_release_claim (int index, int fd);

/* Paths inside a device directory (g_free them). */
char *mloop_state_path (const struct mloop_device_state *s, const char *name);

/* The server's kind's name, "remote", or "ublk" (mloop-ublk serves). */
const char *mloop_state_server_name (const struct mloop_device_state *s);
/* "nbd" or "ublk". */
const char *mloop_state_transport_name (const struct mloop_device_state *s);
/* The device's name, "nbdN" or "ublkbN" (g_free it); its path is
 * /dev/NAME and its sysfs directory /sys/block/NAME.
 */
char *mloop_state_device_name (const struct mloop_device_state *s);
/* The image's name to show: a held image's label, else its file. */
const char *mloop_state_image_name (const struct mloop_device_state *s);
/* Whether S serves as its image the local file or block device of ST
 * (see mloop_state_image_is in device_state.c).
 */
bool mloop_state_image_is (const struct mloop_device_state *s,
                           const struct stat *st);
/* A new token to be a held image's FILE: "held:" and a random UUID. */
char *mloop_state_held_token (void);
/* A new backend identifier for a device of FILE (g_free it). */
char *mloop_state_new_backend (const char *file);
/* S's backend identifier: its own, or FILE in an older state. */
const char *mloop_state_backend (const struct mloop_device_state *s);
/* "/dev/nbdN" or "/dev/ublkbN" (g_free it). */
char *mloop_state_device_path (const struct mloop_device_state *s);

/* Makes a fresh, empty device directory in S->dir. */
int mloop_state_create (struct mloop_device_state *s, char *err,
                        size_t errlen);
/* Writes S->dir/state atomically. */
int mloop_state_save (const struct mloop_device_state *s, char *err,
                      size_t errlen);
/* Writes S->dir/claim likewise: what an attach in progress attaches. */
int mloop_state_save_claim (const struct mloop_device_state *s, char *err,
                            size_t errlen);
/* Writes DIR/supervisor: the supervisor's own record, kept apart from
 * "state" so the two writers never race.
 */
int mloop_state_save_supervisor (const char *dir,
                                 const struct mloop_supervisor_record *r,
                                 char *err, size_t errlen);
/* Reads DIR/state (and DIR/supervisor, which overrides server_pid) into S (which owns copies); -1 if it has none. */
int mloop_state_load (const char *dir, struct mloop_device_state *s);
/* Reads DIR's claim into S: what an attach in progress (or one that died
 * half-way) was making.  0, or -1.
 */
int mloop_state_load_claim (const char *dir, struct mloop_device_state *s);
/* Every device directory with a state file: nbd devices, then ublk
 * ones, each sorted by index.
 */
struct mloop_device_state *mloop_state_list (size_t *n);
/* Whether the device the kernel shows at nbd INDEX with BACKEND is an
 * mloop device of OWNER's (one whose saved state names that backend):
 * one whose node OWNER holds by right.  False for a NULL BACKEND.
 */
bool mloop_state_nbd_device_of (int index, const char *backend, uid_t owner);
/* The claims of the attaches in progress (whose directories have a
 * claim, no state, and their lock held).
 */
struct mloop_device_state *mloop_state_list_claims (size_t *n);
/* Directories without a state file (attaches in progress, or that died
 * half-way).
 */
char **mloop_state_list_incomplete (void);
/* DIR's lock (for mloop_state_unlock) when DIR is an attach that died
 * half-way: no state, and its lock free.  The state is looked for under
 * the lock, which an attach holds until it has written it.  Else -1,
 * errno saying what DIR is: EWOULDBLOCK, its lock held (an attach under
 * way, or a detach or resize); EEXIST, a device made; ENOENT, gone.
 */
int mloop_state_lock_abandoned (const char *dir);
/* Removes a device directory and everything in it. */
void mloop_state_remove (const char *dir);
/* Deletes S's overlay when it was made for S alone (--overlay temp),
 * with its private directory: call it once S's server has stopped, so no
 * write anyone could still read is lost.
 */
void mloop_state_remove_temporary_overlay (const struct mloop_device_state *s);
/* Removes the private directory a temporary overlay at OVERLAY was to
 * be made in (empty: the overlay is gone or was never made).
 */
void mloop_remove_temporary_overlay_dir (const char *overlay);

void mloop_state_clear (struct mloop_device_state *s);
void mloop_state_free_list (struct mloop_device_state *list, size_t n);

#endif /* MLOOP_DEVICE_STATE_H */
