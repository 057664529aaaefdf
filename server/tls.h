/* mloop-server — TLS (GnuTLS): the server's credentials, and a
 * connection's TLS stream behind struct transport_ops.
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
};

/* Loads and checks the credentials (exactly one of psk_file and
 * cert_dir).  Returns -1 with one line naming the file in ERR.
 */
int tls_setup (const struct tls_options *o, char *err, size_t errlen);

/* After STARTTLS's ACK: runs the TLS handshake on FD (blocking).
 * Returns 0 with *T the TLS stream, or -1 (the client failed or went
 * away; nothing to free).
 */
int tls_start (int fd, struct transport *t);

#endif /* MLOOP_SERVER_TLS_H */
