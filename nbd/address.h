/* mloop — where an NBD server listens or an export is found, parsed from
 * the three forms mloop's programs accept:
 *
 *   unix:PATH                  a Unix socket (--listen)
 *   tcp:HOST:PORT              TCP; HOST may be [v6] or, to listen on
 *                              every address, empty (--listen)
 *   nbd://HOST[:PORT][/NAME]   an export on another machine (attach);
 *                              PORT defaults to 10809, NAME to ""
 *
 * nbds:// is refused with the reason: the kernel's NBD client, which
 * every URI ends up with, speaks no TLS.  libc only.  Never prints;
 * errors are one line in ERR, naming the text that was refused.
 */
#ifndef MLOOP_NBD_ADDRESS_H
#define MLOOP_NBD_ADDRESS_H

#include <stddef.h>

/* The forms a caller accepts, or-ed together. */
enum {
  MLOOP_NBD_ADDRESS_UNIX = 1 << 0,
  MLOOP_NBD_ADDRESS_TCP = 1 << 1,
  MLOOP_NBD_ADDRESS_URI = 1 << 2,
};
#define MLOOP_NBD_ADDRESS_LISTEN \
  (MLOOP_NBD_ADDRESS_UNIX | MLOOP_NBD_ADDRESS_TCP)

#define MLOOP_NBD_DEFAULT_PORT "10809"  /* IANA's port for NBD */

/* A Unix socket or a TCP host and port, and the export's name.  A parsed
 * address owns its strings (BUF); one filled in by hand may leave BUF
 * NULL and point anywhere.
 */
struct mloop_nbd_address {
  const char *unix_path;        /* or NULL for TCP */
  const char *host;             /* without IPv6 brackets */
  const char *port;             /* decimal */
  const char *name;             /* export name; "" is the default */
  char *buf;
};

/* Parses TEXT, one of the FORMS, into *A (mloop_nbd_address_clear it).
 * Returns 0, or -1 with ERR and *A empty.
 */
int mloop_nbd_address_parse (const char *text, unsigned forms,
                             struct mloop_nbd_address *a,
                             char *err, size_t errlen);

/* Frees what a parsed address owns and empties *A. */
void mloop_nbd_address_clear (struct mloop_nbd_address *a);

#endif /* MLOOP_NBD_ADDRESS_H */
