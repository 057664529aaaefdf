/* mloop-server — the fixed-newstyle NBD handshake.
 *
 * Runs on a blocking socket (the connection's own short-lived thread, with
 * receive and send timeouts), before any per-connection resources exist.
 * Every length read from the wire is bounded; EOF at any byte ends the
 * connection quietly.
 */
#ifndef MLOOP_SERVER_HANDSHAKE_H
#define MLOOP_SERVER_HANDSHAKE_H

#include <stdbool.h>
#include <stdint.h>

#include "session.h"

struct export_info {
  uint64_t size;
  uint16_t transmission_flags;
  uint32_t min_block, preferred_block, max_block;
  const char *name;             /* the only name served, or NULL: any */
};

/* Negotiates on FD: structured replies and the base:allocation meta
 * context besides the export itself.  Returns 0 when the client entered
 * transmission (NBD_OPT_GO or NBD_OPT_EXPORT_NAME), with what it agreed
 * on in *SESSION; -1 when the connection must be closed (abort, EOF,
 * protocol violation, or an option too large).
 */
int mloop_handshake (int fd, const struct export_info *export,
                     struct session *session);

#endif /* MLOOP_SERVER_HANDSHAKE_H */
