/* mloop-server — TLS (GnuTLS): the server's credentials, and a
 * connection's TLS stream behind struct transport_ops.
 *
 * tls.c is a module of its own, mloop-server-tls.so, that mloop-server
 * loads (tls_load.c) only when --tls asks for it: GnuTLS and the seven
 * libraries it needs cost each start about 100 ms under emulation (the
 * test VM), most of mloop-server's start, on the way of every `mloop
 * attach`, which never uses TLS.
 *
 * Thread model: tls_setup runs once in main before any thread; the
 * credentials are then only read.  A connection's TLS session is used by
 * one thread at a time: its handshake thread (blocking, under the
 * handshake deadline: a shutdown(2) of the socket ends a stalled TLS
 * handshake like any other), then its worker (non-blocking).
 */
#ifndef MLOOP_SERVER_TLS_H
#define MLOOP_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "transport.h"

struct tls_options {
  const char *psk_file;         /* username:hexkey per line, or NULL */
  const char *cert_dir;         /* ca-cert.pem, server-cert.pem,
                                   server-key.pem, ca-crl.pem; or NULL */
  bool verify_peer;             /* clients need a certificate the CA
                                   signed (cert_dir only) */
  /* The server's, for the module's log lines (peer.h, log_limit.h). */
  char *(*peer_address) (int fd);
  void (*log_limited) (const char *fmt, ...);
};

/* In the module. */

/* Loads and checks the credentials (exactly one of psk_file and
 * cert_dir).  Returns -1 with one line naming the file in ERR.
 */
int tls_setup (const struct tls_options *o, char *err, size_t errlen);

/* After STARTTLS's ACK: runs the TLS handshake on FD (blocking).
 * Returns 0 with *T the TLS stream, or -1 (the client failed or went
 * away; nothing to free).
 */
int tls_start (int fd, struct transport *t);

typedef int tls_setup_fn (const struct tls_options *o, char *err,
                          size_t errlen);
typedef int tls_start_fn (int fd, struct transport *t);

/* In mloop-server: loads the module and runs its tls_setup; *START is
 * then its tls_start.  Returns -1 with one line in ERR.
 */
int tls_load (const struct tls_options *o, tls_start_fn **start, char *err,
              size_t errlen);

#endif /* MLOOP_SERVER_TLS_H */
