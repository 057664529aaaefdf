/* mloop-server — which clients are let in.
 *
 * Two caps, both off by default: on the connections open at once
 * (--max-connections, negotiating and served alike) and on those from one
 * client address (--max-connections-per-client; TCP peers only: every
 * client of a Unix socket has the same, empty, address).  A connection
 * over a cap is closed as soon as it is accepted, before the greeting:
 * NBD has no way to say "busy", and a closed socket is what nbdkit's
 * limit filter and a full qemu-nbd --shared give too.  Each refusal is
 * logged under the bound on repeated lines (log_limit.h), so clients
 * retrying in a loop cannot fill the log.
 *
 * Every socket admitted here is closed through admission_close, which
 * counts it out; one mutex guards the counts (taken once per connection
 * at each end, never on the data path).
 */
#ifndef MLOOP_SERVER_ADMISSION_H
#define MLOOP_SERVER_ADMISSION_H

#include <stdbool.h>

/* 0: no cap. */
void admission_init (unsigned max_connections, unsigned max_per_client);

/* Accept loop: FD was just accepted.  true: counted in until
 * admission_close (FD); false: refused and logged (the caller closes FD
 * with close(2)).
 */
bool admission_admit (int fd);

/* Closes FD, a socket admitted earlier, and counts it out. */
void admission_close (int fd);

#endif
