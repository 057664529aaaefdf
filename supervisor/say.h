/* mloop-supervisor — a device's log lines, each stamped with the
 * program's name and the local time: its directory's supervisor.log
 * (stderr, in mloop-supervisor).
 */
#ifndef MLOOP_SUPERVISOR_SAY_H
#define MLOOP_SUPERVISOR_SAY_H

#include <stdio.h>

#include <glib.h>

/* One line into LOG. */
void say_to (FILE *log, const char *fmt, ...) G_GNUC_PRINTF (2, 3);

/* One line into stderr. */
#define say(...) say_to (stderr, __VA_ARGS__)

/* How a server ended, from its wait status, for the log (g_free it). */
char *describe_exit (int status);

#endif /* MLOOP_SUPERVISOR_SAY_H */
