/* mloop-supervisor — its log lines: stderr, which is the device
 * directory's supervisor.log, each line stamped with the local time.
 */
#ifndef MLOOP_SUPERVISOR_SAY_H
#define MLOOP_SUPERVISOR_SAY_H

#include <glib.h>

void say (const char *fmt, ...) G_GNUC_PRINTF (1, 2);

/* How a server ended, from its wait status, for the log (g_free it). */
char *describe_exit (int status);

#endif /* MLOOP_SUPERVISOR_SAY_H */
