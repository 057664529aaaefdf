/* mloop-supervisor — a keeper: what keeps one attached device served by
 * a local server (its image's mloop-server or nbdkit).
 *
 * It starts the server, watches it and, whenever it dies, starts a new
 * one with backoff and hands the kernel fresh connections to it
 * (NBD_CMD_RECONFIGURE); it heals the connections the kernel drops while
 * the server lives; it replaces the server on request (a planned
 * restart: `mloop resize` of a device nbdkit serves); it makes an RBD
 * device follow a resize made elsewhere; and it notices when the kernel
 * let an autoclear device go.  keeper.c says how and why.
 *
 * All of it runs as sources on the thread-default main context, so one
 * process may hold a keeper per device; nothing in it is per process
 * but the child subreaper its owner sets (a daemonizing nbdkit's daemon
 * must become a child of ours to be reaped).
 */
#ifndef MLOOP_SUPERVISOR_KEEPER_H
#define MLOOP_SUPERVISOR_KEEPER_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "nbd_client.h"
#include "server_process.h"

struct keeper;

/* What a keeper is told of its device. */
struct keeper_config {
  const char *dir;              /* the device's directory */
  /* How its server is run: kind, image, window, overlay, threads,
   * read_only and io_timeout; the paths in the directory (socket, pid
   * file, log, counters, RBD lock record) the keeper fills in.
   */
  struct mloop_server_spec server;
  FILE *log;                    /* the device's log lines */
  /* Called once the kernel let an autoclear device go (its last user
   * closed it): the owner stops the keeper with keeper_stop.
   */
  void (*released) (struct keeper *k, void *data);
  void *data;
};

/* For a process that keeps devices for its life (mloopd): holds what
 * every keeper shares, the kernel log and the subscription to the
 * kernel's announcements, from now on, instead of from each first
 * device to each last (opening them costs a netlink family lookup, and
 * one device attached and detached at a time would pay it each time).
 */
void keeper_hold_shared (void);

/* A keeper for the device CONFIG describes (copied; its strings too),
 * listening for the kernel's announcements of dropped connections
 * already, so none about the device is missed once it is connected.
 */
struct keeper *keeper_new (const struct keeper_config *config);

/* Starts the device's first server and begins keeping it: ADOPTED, when
 * not 0, is that server, started beside us as our child (`mloop attach`),
 * of which the keeper only waits for it to listen.  0, or -1 with ERR:
 * the attach's failure.
 */
int keeper_start (struct keeper *k, pid_t adopted, char *err, size_t errlen);

/* Called once keeper_start_async's server listens (ERR NULL) or did not
 * start (ERR says why: the attach's failure).
 */
typedef void (*keeper_started_fn) (struct keeper *k, const char *err,
                                   void *data);

/* keeper_start without waiting: the server is awaited on a thread of its
 * own (server_start.h) and STARTED called on this main context, so one
 * device's slow start holds up no other device of the process.
 * STARTED is not called if the keeper is stopped or let go first.
 */
void keeper_start_async (struct keeper *k, keeper_started_fn started,
                         void *data);

/* keeper_start_async for a device a keeper before this one kept, whose
 * server died while none ran: once the new server listens, the device
 * (if its state exists) is handed fresh connections to it, as after a
 * restart.  A first keep (`mloop attach`) does not: the attach connects
 * the kernel itself.
 */
void keeper_take_over_new (struct keeper *k, keeper_started_fn started,
                           void *data);

/* Whether keeper_start_async's server is still starting. */
bool keeper_starting (const struct keeper *k);

/* Begins keeping a device whose server, SERVER, a keeper before this
 * one started (a service that was restarted): watches it as its own,
 * and offers the kernel connections for slots it dropped meanwhile.
 * 0, or -1 with ERR when SERVER is not the device's server (then
 * keeper_take_over_new).  First it kills what a keeper killed mid-start
 * left running beside SERVER (server_start.h): a server that had not
 * listened yet, a planned restart's next server.
 */
int keeper_take_over (struct keeper *k, pid_t server, char *err,
                      size_t errlen);

/* A planned restart: the next server first, then the handover (keeper.c
 * says why and when the old one goes first); the outcome is recorded
 * for `mloop resize`.
 */
void keeper_restart_server (struct keeper *k);

/* For a device served inside this process (spec.in_process): N
 * connections to its server that need no handshake, in FDS, and what
 * its export is in *X, for an attach to hand the kernel.  0, or -1 with
 * ERR: not served here, or not yet.
 */
int keeper_connections (struct keeper *k, unsigned n, int *fds,
                        struct mloop_nbd_export *x, char *err,
                        size_t errlen);

/* Whether the device's server is served inside this process. */
bool keeper_in_process (const struct keeper *k);

/* The current server's pid, 0 between servers. */
pid_t keeper_server_pid (const struct keeper *k);

/* Stops the server and every source of the keeper, and frees it.  After
 * RELEASED, it also removes the device's directory, as `mloop detach`
 * would.
 */
void keeper_stop (struct keeper *k);

/* Stops every source of K and frees it, leaving its server serving the
 * device: for a keeper after this one to take over.
 */
void keeper_let_go (struct keeper *k);

#endif /* MLOOP_SUPERVISOR_KEEPER_H */
