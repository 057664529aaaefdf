/* mloop — an optional per-request trace, for lining a server's view of
 * each request up with the kernel's (the guest's events/nbd tracepoints).
 *
 * Off unless a front end opens it (mloop-server --trace FILE, the plugin's
 * trace=FILE, or MLOOP_TRACE=FILE in the environment of either).  Each
 * event is one text line:
 *
 *   SECONDS PID/TID EVENT conn=N cookie=HEX CMD OFFSET+LENGTH [error=E]
 *
 * SECONDS is CLOCK_MONOTONIC, the clock the kernel's trace uses with
 * trace_clock=mono, so on the same machine both traces share one time
 * line.  The cookie is the request's 8 bytes in wire order, as one hex
 * number: that is the handle the kernel's nbd tracepoints print on 6.12,
 * and its byte-swap on 6.1 (which puts the handle on the wire in host
 * order).  A front end that never sees the cookie (nbdkit's plugin API
 * does not pass it) prints seq=N, its own request number, instead.
 *
 * Lines are buffered per thread and written with one write(2) to a file
 * opened O_APPEND, so several threads and processes (a server restarted by
 * its supervisor) can share one file without interleaving within a line.
 * A thread's buffer is written when it fills, when the thread calls
 * mloop_trace_flush (), and when the thread exits; with autoflush, after
 * every event.  Errors writing the trace are ignored: it is a diagnostic.
 */
#ifndef MLOOP_TRACE_H
#define MLOOP_TRACE_H

#include <stdbool.h>
#include <stdint.h>

enum mloop_trace_event {
  MLOOP_TRACE_RECV,             /* the request's header was received */
  MLOOP_TRACE_SUBMIT,           /* handed to the kernel (io_submit) */
  MLOOP_TRACE_COMPLETE,         /* its result is known; reply queued */
  MLOOP_TRACE_REPLY,            /* the whole reply went into the socket */
  MLOOP_TRACE_DROP,             /* never answered: the connection died */
  MLOOP_TRACE_RETURN,           /* plugin: returned to nbdkit, which replies */
};

/* Set once mloop_trace_open succeeded; tested by MLOOP_TRACE. */
extern bool mloop_trace_enabled;

/* Opens PATH for appending (created 0644).  With AUTOFLUSH every event is
 * written at once.  Call before starting threads.  -1 with errno on error.
 */
int mloop_trace_open (const char *path, bool autoflush);

/* Records one event.  COOKIE is the request's 8 wire bytes, or NULL to
 * print SEQ instead.  CMD is the NBD command number.
 */
void mloop_trace_record (enum mloop_trace_event event, unsigned conn,
                         const void *cookie, uint64_t seq, uint16_t cmd,
                         uint64_t offset, uint64_t length, int error);

/* Writes what the calling thread has buffered. */
void mloop_trace_flush (void);

/* The hook front ends use: one branch when tracing is off. */
#define MLOOP_TRACE(...) \
  do { if (mloop_trace_enabled) mloop_trace_record (__VA_ARGS__); } while (0)

#endif /* MLOOP_TRACE_H */
