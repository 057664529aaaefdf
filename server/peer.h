/* mloop-server — a client's address, as the log names it. */
#ifndef MLOOP_SERVER_PEER_H
#define MLOOP_SERVER_PEER_H

/* FD's peer as text ("192.0.2.1", "2001:db8::1"; an IPv4 client of an
 * IPv6 socket as IPv4), to be g_free()d; NULL for a Unix socket's client.
 */
char *peer_address (int fd);

#endif
