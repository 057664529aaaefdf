/* mloop — a supervisor and its first server started side by side. */
#ifndef MLOOP_SIDE_BY_SIDE_H
#define MLOOP_SIDE_BY_SIDE_H

#include <stddef.h>
#include <sys/types.h>

#include <glib.h>

/* Forks a child that forks the server (SERVER_ARGV, output to
 * SERVER_LOG), then becomes the supervisor (SUPERVISOR_ARGV, ended by
 * NULL, output to SUPERVISOR_LOG) told "--adopt=PID" of it, so both
 * programs load at once and the server is still the supervisor's child.
 * Each runs in a session of its own with stdin /dev/null and no other
 * descriptor of ours: the child closes those before it forks the server.  Returns at once: 0 with *SUPERVISOR, or -1 with
 * ERR.  Adds the --adopt argument to SUPERVISOR_ARGV.
 */
int mloop_spawn_side_by_side (GPtrArray *supervisor_argv,
                              const char *supervisor_log,
                              char **server_argv, const char *server_log,
                              pid_t *supervisor, char *err, size_t errlen);

#endif /* MLOOP_SIDE_BY_SIDE_H */
