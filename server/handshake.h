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
#include "transport.h"

/* --tls: whether NBD_OPT_STARTTLS is offered, and whether it is
 * required before any other option (NBD_REP_ERR_TLS_REQD).
 */
enum handshake_tls {
  HANDSHAKE_TLS_OFF,            /* STARTTLS gets NBD_REP_ERR_UNSUP */
  HANDSHAKE_TLS_ON,
  HANDSHAKE_TLS_REQUIRE,
};

struct export_info {
  uint64_t size;
  uint16_t transmission_flags;
  uint32_t min_block, preferred_block, max_block;
  const char *name;             /* the only name served, or NULL: any */
  enum handshake_tls tls;
  /* Runs the TLS handshake on FD after STARTTLS's ACK (tls.h): 0 with
   * *T set, or -1 to close.
   */
  int (*start_tls) (int fd, struct transport *t);
};

/* Negotiates on FD: TLS, structured replies and the base:allocation
 * meta context besides the export itself.  Returns 0 when the client
 * entered transmission (NBD_OPT_GO or NBD_OPT_EXPORT_NAME), with what it
 * agreed on in *SESSION (its TLS stream too, which the caller then owns:
 * transport_close); -1 when the connection must be closed (abort, EOF,
 * protocol violation, an option too large, a failed TLS handshake), with
 * any TLS already ended.
 */
int mloop_handshake (int fd, const struct export_info *export,
                     struct session *session);

#endif /* MLOOP_SERVER_HANDSHAKE_H */
