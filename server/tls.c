/* mloop-server — TLS with GnuTLS, the module mloop-server-tls.so.  See
 * tls.h.
 *
 * The socket stays blocking as the handshake left it; our own pull and
 * push functions pass MSG_DONTWAIT once the stream is in transmission
 * (or closing), so GnuTLS sees EAGAIN there and may block nowhere else.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/socket.h>

#include <glib.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include "tls.h"

/* The most plaintext one TLS record carries (RFC 8446, 5.1). */
#define TLS_RECORD 16384

/* Both allow the PSK key exchanges, which GnuTLS's NORMAL leaves out;
 * with certificates NORMAL is what a client expects.
 */
#define PRIORITY_PSK  "NORMAL:+ECDHE-PSK:+DHE-PSK:+PSK"
#define PRIORITY_X509 "NORMAL"

static gnutls_psk_server_credentials_t psk_cred;
static gnutls_certificate_credentials_t x509_cred;
static gnutls_priority_t priority;
static bool verify_peer;
static char *(*peer_address) (int fd);
static void (*log_limited) (const char *fmt, ...);

struct tls_stream {
  gnutls_session_t s;
  int fd;
  bool nonblock;                /* in transmission or closing */
  bool send_again;              /* a record waits in GnuTLS: the next
                                   send must be the NULL, 0 retry */
  char stage[TLS_RECORD];       /* small pieces gathered into a record */
};

/* ------------------------------------------------------------ setup */

/* A line of a PSK file: USERNAME:HEXKEY, the key an even number of hex
 * digits (what GnuTLS, nbdkit and qemu read).
 */
static bool
psk_line_ok (const char *line)
{
  const char *colon = strchr (line, ':');
  size_t n;

  if (colon == NULL || colon == line)
    return false;
  n = strlen (colon + 1);
  return n > 0 && n % 2 == 0 && strspn (colon + 1, "0123456789abcdefABCDEF") == n;
}

/* GnuTLS reads the file at each handshake: check it now, so that a
 * mistake is one line at startup instead of every client refused.
 */
static int
check_psk_file (const char *path, char *err, size_t errlen)
{
  FILE *f = fopen (path, "r");
  char *line = NULL;
  size_t cap = 0;
  ssize_t len;
  unsigned lineno = 0, keys = 0;
  int r = 0;

  if (f == NULL) {
    snprintf (err, errlen, "--tls-psk %s: %s", path, strerror (errno));
    return -1;
  }
  while ((len = getline (&line, &cap, f)) != -1) {
    lineno++;
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
      line[--len] = '\0';
    if (len == 0)
      continue;
    if (!psk_line_ok (line)) {
      snprintf (err, errlen, "--tls-psk %s: line %u: expected "
                "USERNAME:HEXKEY", path, lineno);
      r = -1;
      break;
    }
    keys++;
  }
  if (r == 0 && ferror (f)) {
    snprintf (err, errlen, "--tls-psk %s: %s", path, strerror (errno));
    r = -1;
  }
  else if (r == 0 && keys == 0) {
    snprintf (err, errlen, "--tls-psk %s: no USERNAME:HEXKEY line", path);
    r = -1;
  }
  free (line);
  fclose (f);
  return r;
}

static int
setup_psk (const char *path, char *err, size_t errlen)
{
  int r;

  if (check_psk_file (path, err, errlen) == -1)
    return -1;
  if ((r = gnutls_psk_allocate_server_credentials (&psk_cred)) < 0 ||
      (r = gnutls_psk_set_server_credentials_file (psk_cred, path)) < 0 ||
      (r = gnutls_psk_set_server_known_dh_params (psk_cred,
                                                  GNUTLS_SEC_PARAM_MEDIUM)) < 0) {
    snprintf (err, errlen, "--tls-psk %s: %s", path, gnutls_strerror (r));
    return -1;
  }
  return 0;
}

/* DIR/NAME, after checking it can be read; NULL and ERR set if not
 * (unless it is missing and optional: then NULL and ERR empty).
 */
static char *
cert_file (const char *dir, const char *name, bool required, char *err,
           size_t errlen)
{
  char *path = NULL;

  *err = '\0';
  if (asprintf (&path, "%s/%s", dir, name) == -1) {
    snprintf (err, errlen, "--tls-certificates: %s", strerror (ENOMEM));
    return NULL;
  }
  if (access (path, R_OK) == 0)
    return path;
  if (required || errno != ENOENT)
    snprintf (err, errlen, "--tls-certificates %s: %s", path,
              strerror (errno));
  free (path);
  return NULL;
}

/* Whether PATH holds at least one PEM certificate (KEY false) or a PEM
 * private key (KEY true); ERR names the file if not.
 */
static int
check_pem (const char *path, bool key, char *err, size_t errlen)
{
  gnutls_datum_t data = { NULL, 0 };
  int r = gnutls_load_file (path, &data);

  if (r >= 0 && key) {
    gnutls_x509_privkey_t k;

    if ((r = gnutls_x509_privkey_init (&k)) >= 0) {
      r = gnutls_x509_privkey_import2 (k, &data, GNUTLS_X509_FMT_PEM,
                                       NULL, 0);
      gnutls_x509_privkey_deinit (k);
    }
  }
  else if (r >= 0) {
    gnutls_x509_crt_t *list = NULL;
    unsigned n = 0, i;

    r = gnutls_x509_crt_list_import2 (&list, &n, &data, GNUTLS_X509_FMT_PEM,
                                      0);
    for (i = 0; r >= 0 && i < n; i++)
      gnutls_x509_crt_deinit (list[i]);
    gnutls_free (list);
  }
  gnutls_free (data.data);
  if (r < 0) {
    snprintf (err, errlen, "--tls-certificates %s: not a PEM %s: %s", path,
              key ? "private key" : "certificate", gnutls_strerror (r));
    return -1;
  }
  return 0;
}

/* Says at start when the server's certificate (the first in PATH, which
 * GnuTLS loaded already) is expired or not yet valid: the server runs,
 * as a client may not check dates, but every client that does refuses
 * it, and the operator should hear why before the clients do.
 */
static void
warn_if_not_valid_now (const char *path)
{
  gnutls_datum_t pem = { NULL, 0 };
  gnutls_x509_crt_t crt;
  time_t now = time (NULL), from, until;
  char when[64];

  if (gnutls_load_file (path, &pem) < 0)
    return;
  if (gnutls_x509_crt_init (&crt) == 0) {
    if (gnutls_x509_crt_import (crt, &pem, GNUTLS_X509_FMT_PEM) == 0) {
      from = gnutls_x509_crt_get_activation_time (crt);
      until = gnutls_x509_crt_get_expiration_time (crt);
      if (until != (time_t) -1 && until < now) {
        strftime (when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime (&until));
        fprintf (stderr, "mloop-server: warning: --tls-certificates %s: "
                 "expired on %s: clients that check it refuse the server\n",
                 path, when);
      }
      else if (from != (time_t) -1 && from > now) {
        strftime (when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime (&from));
        fprintf (stderr, "mloop-server: warning: --tls-certificates %s: "
                 "not valid before %s: clients that check it refuse the "
                 "server\n", path, when);
      }
    }
    gnutls_x509_crt_deinit (crt);
  }
  gnutls_free (pem.data);
}

static int
setup_x509 (const char *dir, bool verify, char *err, size_t errlen)
{
  char *cert = NULL, *key = NULL, *ca = NULL, *crl = NULL;
  int r, ret = -1;

  if ((cert = cert_file (dir, "server-cert.pem", true, err, errlen)) == NULL ||
      (key = cert_file (dir, "server-key.pem", true, err, errlen)) == NULL)
    goto out;
  ca = cert_file (dir, "ca-cert.pem", verify, err, errlen);
  if (*err)
    goto out;
  crl = cert_file (dir, "ca-crl.pem", false, err, errlen);
  if (*err)
    goto out;
  if (check_pem (cert, false, err, errlen) == -1 ||
      check_pem (key, true, err, errlen) == -1)
    goto out;
  if ((r = gnutls_certificate_allocate_credentials (&x509_cred)) < 0) {
    snprintf (err, errlen, "--tls-certificates: %s", gnutls_strerror (r));
    goto out;
  }
  r = gnutls_certificate_set_x509_key_file (x509_cred, cert, key,
                                            GNUTLS_X509_FMT_PEM);
  if (r < 0) {
    snprintf (err, errlen, "--tls-certificates %s, %s: %s", cert, key,
              gnutls_strerror (r));
    goto out;
  }
  if (ca && (r = gnutls_certificate_set_x509_trust_file
             (x509_cred, ca, GNUTLS_X509_FMT_PEM)) <= 0) {
    snprintf (err, errlen, "--tls-certificates %s: %s", ca,
              r == 0 ? "no certificate" : gnutls_strerror (r));
    goto out;
  }
  if (crl && (r = gnutls_certificate_set_x509_crl_file
              (x509_cred, crl, GNUTLS_X509_FMT_PEM)) < 0) {
    snprintf (err, errlen, "--tls-certificates %s: %s", crl,
              gnutls_strerror (r));
    goto out;
  }
  gnutls_certificate_set_known_dh_params (x509_cred, GNUTLS_SEC_PARAM_MEDIUM);
  warn_if_not_valid_now (cert);
  ret = 0;

 out:
  free (cert);
  free (key);
  free (ca);
  free (crl);
  return ret;
}

int
tls_setup (const struct tls_options *o, char *err, size_t errlen)
{
  const char *prio = o->psk_file ? PRIORITY_PSK : PRIORITY_X509;
  int r;

  peer_address = o->peer_address;
  log_limited = o->log_limited;
  if (o->psk_file ? setup_psk (o->psk_file, err, errlen)
      : setup_x509 (o->cert_dir, o->verify_peer, err, errlen))
    return -1;
  if ((r = gnutls_priority_init (&priority, prio, NULL)) < 0) {
    snprintf (err, errlen, "TLS priority %s: %s", prio, gnutls_strerror (r));
    return -1;
  }
  verify_peer = o->verify_peer && o->cert_dir;
  return 0;
}

/* ------------------------------------------------------------ the wire */

static ssize_t
pull (gnutls_transport_ptr_t ptr, void *buf, size_t n)
{
  struct tls_stream *t = ptr;
  ssize_t r = recv (t->fd, buf, n, t->nonblock ? MSG_DONTWAIT : 0);

  if (r == -1)
    gnutls_transport_set_errno (t->s, errno);
  return r;
}

/* Needed by GnuTLS's own timeouts once a pull function is ours. */
static int
pull_timeout (gnutls_transport_ptr_t ptr, unsigned ms)
{
  struct tls_stream *t = ptr;
  struct pollfd p = { t->fd, POLLIN, 0 };
  int r = poll (&p, 1, ms == GNUTLS_INDEFINITE_TIMEOUT ? -1 : (int) ms);

  if (r == -1)
    gnutls_transport_set_errno (t->s, errno);
  return r;
}

static ssize_t
push (gnutls_transport_ptr_t ptr, const giovec_t *iov, int n)
{
  struct tls_stream *t = ptr;
  struct msghdr m = { .msg_iov = (struct iovec *) iov,
                      .msg_iovlen = (size_t) n };
  ssize_t r = sendmsg (t->fd, &m,
                       MSG_NOSIGNAL | (t->nonblock ? MSG_DONTWAIT : 0));

  if (r == -1)
    gnutls_transport_set_errno (t->s, errno);
  return r;
}

/* ------------------------------------------------------------ ops */

static int
tls_recv_full (void *ctx, void *buf, size_t n)
{
  struct tls_stream *t = ctx;
  char *p = buf;

  while (n > 0) {
    ssize_t r = gnutls_record_recv (t->s, p, n);

    if (r == GNUTLS_E_INTERRUPTED)
      continue;
    if (r <= 0) {
      errno = r == 0 ? ECONNRESET : EIO;
      return -1;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

static int
tls_send_full (void *ctx, const void *buf, size_t n)
{
  struct tls_stream *t = ctx;
  const char *p = buf;

  while (n > 0) {
    ssize_t r = gnutls_record_send (t->s, p, n);

    if (r == GNUTLS_E_INTERRUPTED)
      continue;
    if (r <= 0) {
      errno = EIO;
      return -1;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

/* GnuTLS's error R as recv(2) or send(2) would have it. */
static ssize_t
as_errno (ssize_t r)
{
  errno = r == GNUTLS_E_AGAIN ? EAGAIN
    : r == GNUTLS_E_INTERRUPTED ? EINTR : ECONNRESET;
  return -1;
}

static ssize_t
tls_recv (void *ctx, void *buf, size_t n)
{
  struct tls_stream *t = ctx;
  ssize_t r;

  t->nonblock = true;
  r = gnutls_record_recv (t->s, buf, n);
  if (r >= 0)
    return r;
  if (r == GNUTLS_E_PREMATURE_TERMINATION)
    return 0;                   /* EOF without close_notify: still EOF */
  return as_errno (r);
}

/* Sends the pieces as TLS records of up to TLS_RECORD bytes: a piece
 * that long goes straight from its buffer, shorter ones (reply headers,
 * small reads) are gathered into one record.  Returns the bytes sent,
 * counted from the first piece.
 */
static ssize_t
tls_sendv (void *ctx, const struct iovec *iov, size_t n)
{
  struct tls_stream *t = ctx;
  size_t i = 0, off = 0, total = 0;

  t->nonblock = true;
  if (t->send_again) {
    /* GnuTLS holds the record it could not send: the rule is to call
     * again with NULL, 0 (or the same data), and it returns that
     * record's length.  The caller's unsent bytes start with it.
     */
    ssize_t r = gnutls_record_send (t->s, NULL, 0);

    if (r < 0)
      return as_errno (r);
    t->send_again = false;
    return r;
  }
  while (i < n) {
    const char *p;
    size_t len;
    ssize_t r;

    if (iov[i].iov_len - off >= TLS_RECORD) {
      p = (const char *) iov[i].iov_base + off;
      len = TLS_RECORD;
    }
    else {
      /* Gather, without moving I and OFF yet: only what is sent counts. */
      size_t j = i, o = off;

      len = 0;
      while (j < n && len < TLS_RECORD) {
        size_t m = iov[j].iov_len - o;

        if (m > TLS_RECORD - len)
          m = TLS_RECORD - len;
        memcpy (t->stage + len, (const char *) iov[j].iov_base + o, m);
        len += m;
        o += m;
        if (o == iov[j].iov_len) {
          j++;
          o = 0;
        }
      }
      p = t->stage;
    }
    r = gnutls_record_send (t->s, p, len);
    if (r < 0) {
      if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED)
        t->send_again = true;
      if (total)
        return (ssize_t) total;
      return as_errno (r);
    }
    total += (size_t) r;
    /* Step I and OFF over the R bytes sent. */
    for (size_t k = (size_t) r; k > 0 && i < n;) {
      size_t m = iov[i].iov_len - off;

      if (k < m) {
        off += k;
        k = 0;
      }
      else {
        k -= m;
        i++;
        off = 0;
      }
    }
    while (i < n && iov[i].iov_len == 0)
      i++;
    if ((size_t) r < len)
      break;                    /* a smaller record limit: call again */
  }
  return (ssize_t) total;
}

static bool
tls_pending (void *ctx)
{
  struct tls_stream *t = ctx;

  return gnutls_record_check_pending (t->s) > 0;
}

static void
tls_close (void *ctx)
{
  struct tls_stream *t = ctx;

  /* close_notify if the socket takes it now; never wait for the peer's. */
  t->nonblock = true;
  gnutls_bye (t->s, GNUTLS_SHUT_WR);
  gnutls_deinit (t->s);
  free (t);
}

static const struct transport_ops tls_ops = {
  .recv_full = tls_recv_full,
  .send_full = tls_send_full,
  .recv = tls_recv,
  .sendv = tls_sendv,
  .pending = tls_pending,
  .close = tls_close,
};

/* ------------------------------------------------------------ start */

/* A handshake that failed for another reason than the client going
 * away or the deadline (a wrong key, a certificate the CA did not sign,
 * none at all under --tls-verify-peer) is an authentication failure an
 * operator must be able to see, credential guessing included: logged
 * with the peer's address, under the bound on repeated lines.
 */
static void
log_handshake_failure (int fd, int r)
{
  char *address;

  switch (r) {
  case GNUTLS_E_PULL_ERROR:
  case GNUTLS_E_PUSH_ERROR:
  case GNUTLS_E_PREMATURE_TERMINATION:
  case GNUTLS_E_UNEXPECTED_PACKET_LENGTH:
  case GNUTLS_E_TIMEDOUT:
    return;                     /* gone, or cut off at the deadline */
  }
  address = peer_address (fd);
  log_limited ("TLS handshake with %s failed: %s",
               address ? address : "a Unix socket client", gnutls_strerror (r));
  g_free (address);
}

int
tls_start (int fd, struct transport *out)
{
  struct tls_stream *t = calloc (1, sizeof *t);
  int r;

  if (t == NULL)
    return -1;
  t->fd = fd;
  if (gnutls_init (&t->s, GNUTLS_SERVER) < 0) {
    free (t);
    return -1;
  }
  if (gnutls_priority_set (t->s, priority) < 0 ||
      (psk_cred
       ? gnutls_credentials_set (t->s, GNUTLS_CRD_PSK, psk_cred)
       : gnutls_credentials_set (t->s, GNUTLS_CRD_CERTIFICATE, x509_cred)) < 0)
    goto fail;
  if (verify_peer) {
    gnutls_certificate_server_set_request (t->s, GNUTLS_CERT_REQUIRE);
    gnutls_session_set_verify_cert (t->s, NULL, 0);
  }
  gnutls_transport_set_ptr (t->s, t);
  gnutls_transport_set_pull_function (t->s, pull);
  gnutls_transport_set_pull_timeout_function (t->s, pull_timeout);
  gnutls_transport_set_vec_push_function (t->s, push);
  /* The accept loop's handshake deadline bounds it (pending.h). */
  gnutls_handshake_set_timeout (t->s, 0);
  do
    r = gnutls_handshake (t->s);
  while (r < 0 && !gnutls_error_is_fatal (r) && r != GNUTLS_E_AGAIN);
  if (r < 0) {
    log_handshake_failure (fd, r);
    goto fail;
  }
  out->ops = &tls_ops;
  out->ctx = t;
  return 0;

 fail:
  gnutls_deinit (t->s);
  free (t);
  return -1;
}
