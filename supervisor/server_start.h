/* A server started without holding up the main loop.
 *
 * A server may take long to listen: nbdkit under emulation, an RBD
 * cluster slow to answer, an image on a stalled disk; it is given up to
 * a minute.  mloopd keeps every device on one main loop, where that
 * wait would hold up every other device's supervision and every request
 * on its control socket.  So the server is spawned on the main loop's
 * thread (mloopd looks for the children it must reap among those of its
 * main thread), waited for on a thread of its own, and its outcome
 * handed back on the main context it was started from.
 *
 * At most 2 x the CPUs the process may run on (at least 4) are spawned
 * and not yet listening at once: each loads its image, nbdkit its
 * plugins, an RBD image its cluster connection, and a boot or a
 * takeover would start every device's at once.  The rest are queued,
 * first come first, and spawned as those end.
 */
#ifndef MLOOP_SUPERVISOR_SERVER_START_H
#define MLOOP_SUPERVISOR_SERVER_START_H

#include <stdbool.h>
#include <sys/types.h>

#include "server_process.h"

struct server_start;

/* Called on the starting main context: PID, the server listening, or 0
 * with ERR saying why it did not start (the child is reaped then).
 */
typedef void (*server_started_fn) (pid_t pid, const char *err, void *data);

/* Spawns SPEC's server (copied), or queues it past the cap (or, ADOPTED
 * not 0, waits for that child already spawned), and calls DONE once it
 * listens or failed, within TIMEOUT_MS of its spawn (the time queued
 * does not count).  NULL with ERR when it could not even be spawned
 * (DONE is not called); a queued start's spawn that fails is told DONE.
 */
struct server_start *server_start_begin (const struct mloop_server_spec *spec,
                                         pid_t adopted, unsigned timeout_ms,
                                         server_started_fn done, void *data,
                                         char *err, size_t errlen);

/* The caller no longer wants the outcome: DONE is not called; a server
 * that starts anyway is left serving when KEEP_SERVING (its device is
 * let go, for the next service to take over), else stopped.  A queued
 * start is dropped, nothing spawned (the next service starts a device
 * let go anew).
 */
void server_start_abandon (struct server_start *s, bool keep_serving);

/* server_start_abandon without its server serving on, and at once:
 * a server spawned is killed now, and this returns once it is gone (its
 * overlay's and image's locks with it), not when the loop runs again,
 * which a stopping process's may not.  S's outcome is then dropped as
 * an abandoned start's.  An adopted child is only abandoned.
 */
void server_start_kill (struct server_start *s);

/* Whether PID is a child a start is waiting for (its exit is the
 * start's to reap).
 */
bool server_start_awaits (pid_t pid);

/* How many starts are under way, queued and abandoned ones included. */
unsigned server_starts_pending (void);

/* Kills the server of every start under way that spawned its own (not
 * an adopted one): each start then ends as a failure, its child reaped
 * by its thread; a queued one ends as a failure unspawned.  For a
 * process that must end before they would: a server that has not
 * listened has served nothing.
 */
void server_starts_kill (void);

/* A start records the server it spawned in PID_FILE.starting (its pid)
 * from the spawn until the start ends: until the server listens and
 * writes PID_FILE, nothing else names it.  A process killed mid-start
 * (SIGKILL at systemd's stop timeout, a crash) leaves the record behind,
 * and the server starting, reparented away: the next keeper of the
 * device stops it (keeper_take_over), or two servers would serve one
 * device.  The pid a record left behind names (0 when none; the process
 * may be gone, or the pid another's), and its removal.
 */
pid_t server_start_left (const char *pid_file);
void server_start_forget (const char *pid_file);

#endif /* MLOOP_SUPERVISOR_SERVER_START_H */
