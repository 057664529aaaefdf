/* mloop-server — connections still negotiating: their deadline and cap.
 *
 * Thread model: the accept loop (main thread) registers each connection
 * before starting its handshake thread, expires deadlines and, on exit,
 * drains; each handshake thread unregisters its connection when
 * negotiation is over, and counts itself out last.  One mutex guards the
 * list and the counts.
 *
 * A connection is dropped by shutdown(2) on its socket, from the accept
 * loop, which wakes its thread from any blocking recv or send: so the
 * deadline covers the whole handshake, however the client trickles it.
 * The socket stays open until its thread closes it, so its number cannot
 * be reused under us.  Entries are kept in order of acceptance, which is
 * deadline order (one timeout for all): the oldest is always at the head.
 */
#ifndef MLOOP_SERVER_PENDING_H
#define MLOOP_SERVER_PENDING_H

#include <stdbool.h>

struct pending;

/* TIMEOUT_S for each handshake, at most MAX negotiating at once. */
void pending_init (unsigned timeout_s, unsigned max);

/* Accept loop: registers FD, just accepted, with its deadline.  When MAX
 * connections are already negotiating, the oldest is dropped to make room
 * (so a flood of idle connections cannot lock out a client that
 * negotiates promptly), with a log line at most every 10 s.  Returns NULL
 * when out of memory (close FD).
 */
struct pending *pending_begin (int fd);

/* P's socket. */
int pending_fd (const struct pending *p);

/* Accept loop, when the handshake thread could not be started: forgets P
 * (the caller closes the socket).
 */
void pending_abandon (struct pending *p);

/* Handshake thread, when negotiation is over: unregisters P (the accept
 * loop frees it later).
 * Returns false if the connection must not be served even though it
 * negotiated (it was dropped meanwhile, or the server is stopping).
 */
bool pending_leave (struct pending *p);

/* Handshake thread, last thing it does: counts it out. */
void pending_end (void);

/* Accept loop: drops connections past their deadline.  Returns the
 * milliseconds until the next deadline, or -1 if none.
 */
int pending_expire (void);

/* On exit, after the listener is closed: drops every pending connection
 * and waits for all handshake threads to end.
 */
void pending_drain (void);

#endif /* MLOOP_SERVER_PENDING_H */
