/* mloop-dbus — the lines a user's refused calls write to the log,
 * bounded per user.
 *
 * A refused attach is one line in the service's log (the journal), and
 * a refusal costs its caller a few milliseconds: one user repeating
 * one, say an attach past their --max-devices-per-user, with a name of
 * 4,095 control characters (each shown as four), wrote 8 MB of log a
 * second.  The journal then drops the service's lines past its rate
 * limit, every other user's and root's among them, and rotates out
 * what it kept from before.  So each user (not root) has at most
 * MLOOP_REFUSAL_LOG_LINES refusal lines in any window of
 * MLOOP_REFUSAL_LOG_WINDOW_S seconds; at the window's end one line says
 * how many more were not logged.  Whatever else the service logs is
 * bounded by what it costs: an attach that works takes a device, and a
 * second or two.  Every line shows at most the first 256 bytes of the
 * escaped name (manager.c), not the 16 KB a name can escape to.
 *
 * Thread-safe: the device thread logs; the counts of lines not logged
 * are said in the main loop's thread, or by mloop_refusal_log_flush.
 */
#ifndef MLOOP_DBUS_REFUSAL_LOG_H
#define MLOOP_DBUS_REFUSAL_LOG_H

#include <sys/types.h>

#define MLOOP_REFUSAL_LOG_LINES 5
#define MLOOP_REFUSAL_LOG_WINDOW_S 10

/* Logs the refusal of UID's call (FMT, a line with no newline, as for
 * g_message) unless UID's lines for this window are spent; then counts
 * it as not logged.  UID is the person who called (dbus/caller.h): the
 * lines of all their subordinate uids are counted together.
 */
void mloop_refusal_log (uid_t uid, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* Says now, for every user, how many of their refusals were not logged
 * (the service is stopping).
 */
void mloop_refusal_log_flush (void);

#endif /* MLOOP_DBUS_REFUSAL_LOG_H */
