/* mloop — the client side of the NBD handshake.
 *
 * `mloop attach` negotiates every connection itself and then
 * hands the socket to the kernel's NBD client, which speaks only the
 * transmission phase.  This negotiates fixed newstyle with NBD_OPT_GO,
 * asking for NBD_INFO_BLOCK_SIZE, and falls back to NBD_OPT_EXPORT_NAME
 * for servers without GO.  Blocking; the caller sets socket timeouts.
 * Errors: -1 with errno set and one line in ERR (see nbd_proto.h).
 */
#ifndef MLOOP_NBD_CLIENT_H
#define MLOOP_NBD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct mloop_nbd_export {
  uint64_t size;
  uint16_t flags;               /* transmission flags (NBD_FLAG_*) */
  /* Block size constraints; 0 when the server did not send them. */
  uint32_t min_block, preferred_block, max_block;
};

/* Negotiates export NAME on the connected socket FD.  Returns 0 with *X
 * filled in when the connection is ready for transmission, or -1.
 */
int mloop_nbd_client_go (int fd, const char *name,
                         struct mloop_nbd_export *x, char *err,
                         size_t errlen);

#endif /* MLOOP_NBD_CLIENT_H */
