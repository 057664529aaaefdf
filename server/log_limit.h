/* mloop-server — one bound on every log line a client can repeat.
 *
 * A client can make the server log: a refused connection, a failed
 * request, a failed TLS authentication.  Each alone is one line, but a
 * client repeating it (or many clients: a /64 of IPv6 source addresses
 * is one attacker) must not fill the log or the disk under it.  So every
 * such line goes through here: at most LOG_LIMIT_LINES of them in any
 * LOG_LIMIT_INTERVAL_S window, whoever logs them, and the first line
 * after some were dropped says how many.  Lines that cannot repeat (a
 * start-up warning, a shutdown notice) are written directly.
 *
 * Thread-safe: the accept loop, the handshake threads and the workers
 * all log through it (one mutex, taken only to log).
 */
#ifndef MLOOP_SERVER_LOG_LIMIT_H
#define MLOOP_SERVER_LOG_LIMIT_H

#define LOG_LIMIT_INTERVAL_S 10
#define LOG_LIMIT_LINES 20
/* A log file (stderr) that reaches this size is emptied first: a
 * device's server.log is on /run, in RAM, and a client may make the
 * server log for as long as it runs.
 */
#define LOG_LIMIT_FILE_BYTES (256 * 1024)

/* Writes one line (FMT, no newline) to stderr, prefixed "mloop-server: ",
 * unless this window's lines are spent; then counts it as suppressed.
 * A log file past LOG_LIMIT_FILE_BYTES is emptied first, with a line
 * saying so.
 */
void log_limited (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));

/* Milliseconds until the suppressed lines should be reported (the end of
 * the window they were dropped in), or -1 when none were.  For a loop
 * that would otherwise sleep with the count unsaid.
 */
int log_limit_due_ms (void);

/* Reports the lines suppressed so far, if any, once their window has
 * ended (FINAL: now, whatever the window: at exit).
 */
void log_limit_report (int final);

#endif
