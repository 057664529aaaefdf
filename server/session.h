/* mloop-server — what a client negotiated that changes transmission.
 *
 * The handshake (handshake.c) fills it in; the connection (conn.c) keeps
 * it and answers accordingly.  A client that negotiates nothing (the
 * kernel, nbd-client) gets the all-false session: simple replies only,
 * exactly as before structured replies existed.
 */
#ifndef MLOOP_SERVER_SESSION_H
#define MLOOP_SERVER_SESSION_H

#include <stdbool.h>

#include "transport.h"

/* The id given to base:allocation when a client selects it: any value
 * would do (ids are per connection and opaque to the client).
 */
#define SESSION_BASE_ALLOCATION_ID 1

struct session {
  bool structured_replies;      /* NBD_OPT_STRUCTURED_REPLY acknowledged */
  bool base_allocation;         /* base:allocation selected, for the
                                   export entered: BLOCK_STATUS allowed */
  struct transport transport;   /* TLS, if started; else plain */
};

#endif /* MLOOP_SERVER_SESSION_H */
