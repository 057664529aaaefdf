/* mloop — starting and stopping the server behind an attached device.
 *
 * The server (native mloop-server, or nbdkit with the mloop plugin) runs
 * detached from the caller: its own session, stdin from /dev/null, stdout
 * and stderr into a log file, so it outlives `mloop attach` and a failed
 * start can be explained with the server's own last words.  Never prints.
 */
#ifndef MLOOP_SERVER_PROCESS_H
#define MLOOP_SERVER_PROCESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <glib.h>

#include "server_kind.h"

/* The server behind a device: on a private Unix socket, in the
 * background.
 */
struct mloop_server_spec {
  const struct mloop_server_kind *kind;
  const char *image;
  uint64_t offset, sizelimit;   /* the window served (server_kind.h) */
  const char *overlay;          /* copy-on-write overlay, or NULL */
  /* Refuse to start when the overlay is gone rather than make it anew
   * (server_kind.h): set by the keeper for every start but the first,
   * when the device is in use.
   */
  bool overlay_must_exist;
  const char *lock_record;      /* an RBD image's (server_kind.h), or NULL */
  unsigned io_timeout;          /* an RBD image's (server_kind.h), or 0 */
  const char *socket_path;      /* Unix socket to listen on */
  const char *pid_file;         /* written by the server once listening */
  const char *log_file;         /* the server's stdout and stderr */
  const char *stats_file;       /* request counters (stats.h), or NULL */
  unsigned threads;             /* IO workers; 0 = the server's default */
  bool read_only;
  /* Served inside the process that keeps the device (mloopd's hosted
   * servers, server/hosted_server.h), not by a program of its own: the
   * same socket and handshake, no pid file, no process.  The native
   * kind only.
   */
  bool in_process;
};

/* A program or plugin mloop runs: ENV_NAME's value if set; else
 * BUILD_RELATIVE next to the running program when it runs from the build
 * tree; else INSTALLED.  g_free the result.
 */
char *mloop_locate_program (const char *env_name, const char *build_relative,
                            const char *installed);

/* Starts the server and waits up to TIMEOUT_MS until it listens (its pid
 * file appears).  If it exits or times out first, it is killed, ERR says
 * why (the last line of its log when there is one) and -1 is returned.
 */
int mloop_server_start (const struct mloop_server_spec *spec,
                        unsigned timeout_ms, pid_t *pid,
                        char *err, size_t errlen);

/* Waits up to TIMEOUT_MS for CHILD, started to write PID_FILE (or, when
 * MAY_DAEMONIZE, to exit 0 leaving a daemon that writes it), to do so:
 * 0 with *PID, the pid in the file, or -1 with ERR, CHILD's own last words
 * in LOG_FILE ("WHAT: why") when it ended.  Kills CHILD at the timeout.
 */
int mloop_process_await (pid_t child, const char *pid_file,
                         bool may_daemonize, const char *log_file,
                         const char *what, unsigned timeout_ms, pid_t *pid,
                         char *err, size_t errlen);

/* Spawns SPEC's server as *CHILD without waiting for it to listen
 * (mloop_server_await does).  0, or -1 with ERR.
 */
int mloop_server_spawn (const struct mloop_server_spec *spec, pid_t *child,
                        char *err, size_t errlen);

/* Waits up to TIMEOUT_MS for a server spawned as CHILD from SPEC's
 * command to write its pid file (*PID).  Kills CHILD at the timeout.
 * 0, or -1 with ERR: why it ended, in its own words where it said them.
 */
int mloop_server_await (const struct mloop_server_spec *spec, pid_t child,
                        unsigned timeout_ms, pid_t *pid,
                        char *err, size_t errlen);

/* Appends --offset=N and --sizelimit=N to ARGV (of g_free()d strings),
 * each only when not 0, and --overlay=FILE when OVERLAY is not NULL:
 * the options naming what is served that every program of ours takes.
 */
void mloop_add_image_args (GPtrArray *argv, uint64_t offset,
                           uint64_t sizelimit, const char *overlay);

/* Starts ARGV detached, like a server, with its output in LOG_FILE, and
 * waits up to TIMEOUT_MS for PID_FILE to name a process (*PID; *CHILD,
 * unless NULL, is the process started, which may be another one that
 * starts the one named).  WHAT is the program's name: its own last words
 * "WHAT: why" become ERR.
 */
int mloop_process_start (char **argv, const char *log_file,
                         const char *pid_file, const char *what,
                         unsigned timeout_ms, pid_t *child, pid_t *pid,
                         char *err, size_t errlen);

/* mloop_process_start in two steps, for an event loop that must not wait:
 * mloop_process_spawn starts ARGV (*CHILD), and mloop_process_check,
 * called until it is not 0, says 1 once PID_FILE names a process (*PID),
 * or -1 with ERR once CHILD has exited (reaped) without serving.
 */
int mloop_process_spawn (char **argv, const char *log_file, const char *what,
                         pid_t *child, char *err, size_t errlen);
int mloop_process_check (pid_t child, const char *log_file,
                         const char *pid_file, const char *what, pid_t *pid,
                         char *err, size_t errlen);

/* Starts a supervisor (SUPERVISOR_ARGV, ended by NULL) and its first
 * server (SERVER_ARGV, output to SERVER_LOG) side by side
 * (side_by_side.h) and waits up to TIMEOUT_MS for the server to write
 * SERVER_PID_FILE and the supervisor its own pid file in DIR, the
 * device's directory.  *SUPERVISOR and *SERVER are their pids.  0, or -1
 * with ERR in the supervisor's words (the server's error, when it failed).
 * At the timeout the supervisor is stopped (its server with it), or, if
 * the child forked to become it has not yet, that child is killed
 * (reaped if it ends within a second; one waiting in a close of a
 * descriptor it inherited dies as that close ends, without exec'ing).
 */
int mloop_supervised_start (GPtrArray *supervisor_argv, char **server_argv,
                            const char *server_log,
                            const char *server_pid_file, const char *dir,
                            unsigned timeout_ms, pid_t *supervisor,
                            pid_t *server, char *err, size_t errlen);

/* Starts mloop-supervisor for device directory DIR and the server of
 * SPEC (its files in DIR) beside it (mloop_supervised_start); the
 * supervisor restarts the server when it dies.  *SUPERVISOR and *SERVER
 * are their pids once the server listens.
 */
int mloop_supervisor_start (const struct mloop_server_spec *spec,
                            const char *dir, unsigned timeout_ms,
                            pid_t *supervisor, pid_t *server,
                            char *err, size_t errlen);

/* Starts mloop-supervisor for the device in directory DIR on the remote
 * export URI (nbd://): no server to start, only connections to heal.
 * Waits up to TIMEOUT_MS until it listens for the kernel's
 * announcements (its pid file appears); *SUPERVISOR is its pid.
 */
int mloop_supervisor_start_remote (const char *uri, const char *dir,
                                   unsigned timeout_ms, pid_t *supervisor,
                                   char *err, size_t errlen);

/* Whether PID is a live process whose command line mentions MARK (its
 * socket path, or for a supervisor its directory): a pid file can outlive
 * its process and the pid be reused.
 */
bool mloop_server_running (pid_t pid, const char *mark);

/* SIGTERM, then SIGKILL after TIMEOUT_MS; returns once PID is gone.
 * Does nothing when PID's command line does not mention MARK.
 */
void mloop_server_stop (pid_t pid, const char *mark, unsigned timeout_ms);

#endif /* MLOOP_SERVER_PROCESS_H */
