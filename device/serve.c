/* mloop — `mloop serve`: an image served to other machines. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "address.h"
#include "errmsg.h"
#include "serve.h"
#include "store_name.h"

int
mloop_tls_mode_parse (const char *s, enum mloop_tls_mode *mode)
{
  if (strcmp (s, "off") == 0)
    *mode = MLOOP_TLS_OFF;
  else if (strcmp (s, "on") == 0)
    *mode = MLOOP_TLS_ON;
  else if (strcmp (s, "require") == 0)
    *mode = MLOOP_TLS_REQUIRE;
  else
    return -1;
  return 0;
}

/* The Unix socket's directory: created 0700 when missing, so only root
 * (and whoever root lets in) can reach the image.
 */
static bool
prepare_unix_dir (const char *path, char *err, size_t errlen)
{
  g_autofree char *dir = g_path_get_dirname (path);

  if (g_file_test (dir, G_FILE_TEST_IS_DIR))
    return true;
  if (g_mkdir_with_parents (dir, 0700) == -1) {
    mloop_fail (err, errlen, "cannot create %s: %s", dir, strerror (errno));
    return false;
  }
  return true;
}

/* Checks R and chooses the server: the one asked for, else the default,
 * or one that serves TLS when TLS is asked for.
 */
static const struct mloop_server_kind *
check_request (const struct mloop_serve_request *r, char *err, size_t errlen)
{
  const struct mloop_server_kind *kind;
  int fd;

  /* An RBD image's server says what is wrong with it. */
  fd = mloop_is_rbd_name (r->file) ? -2
    : open (r->file, (r->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1) {
    mloop_fail (err, errlen, "%s: %s", r->file, strerror (errno));
    return NULL;
  }
  if (fd >= 0)
    close (fd);
  if (r->listen == NULL) {
    mloop_fail (err, errlen, "--listen unix:PATH or tcp:HOST:PORT is required");
    return NULL;
  }
  if (r->tls != MLOOP_TLS_OFF && r->server && !r->server->tls) {
    mloop_fail (err, errlen, "the %s server has no TLS: use --server %s, "
                "or leave --server out", r->server->name,
                mloop_server_kind_tls ()->name);
    return NULL;
  }
  if (r->tls != MLOOP_TLS_OFF && !r->tls_psk && !r->tls_certificates) {
    mloop_fail (err, errlen, "--tls needs --tls-psk FILE or --tls-certificates DIR");
    return NULL;
  }
  if (r->tls_psk && r->tls_certificates) {
    mloop_fail (err, errlen, "--tls-psk and --tls-certificates exclude each other");
    return NULL;
  }
  if ((r->tls_psk || r->tls_certificates) && r->tls == MLOOP_TLS_OFF) {
    mloop_fail (err, errlen, "--tls-psk/--tls-certificates need --tls on|require");
    return NULL;
  }
  if (r->tls_verify_peer && !r->tls_certificates) {
    mloop_fail (err, errlen, "--tls-verify-peer needs --tls-certificates DIR");
    return NULL;
  }
  if (r->tls_psk && access (r->tls_psk, R_OK) == -1) {
    mloop_fail (err, errlen, "--tls-psk %s: %s", r->tls_psk, strerror (errno));
    return NULL;
  }
  if (r->tls_certificates &&
      !g_file_test (r->tls_certificates, G_FILE_TEST_IS_DIR)) {
    mloop_fail (err, errlen, "--tls-certificates %s: not a directory",
          r->tls_certificates);
    return NULL;
  }
  kind = r->server ? r->server
    : r->tls != MLOOP_TLS_OFF ? mloop_server_kind_tls ()
    : mloop_server_kind_default ();
  if (r->max_per_client && !kind->per_client_cap) {
    mloop_fail (err, errlen, "--max-connections-per-client: the %s server "
                "has no per-client cap (--max-connections is served)",
                kind->name);
    return NULL;
  }
  if (r->keepalive && !kind->keepalive_settings) {
    mloop_fail (err, errlen, "--keepalive: the %s server takes no keepalive "
                "settings", kind->name);
    return NULL;
  }
  return kind;
}

char **
mloop_serve_command (const struct mloop_serve_request *r, char *err,
                     size_t errlen)
{
  const struct mloop_server_kind *kind;
  struct mloop_nbd_address a;
  struct mloop_server_config c;
  char why[256];
  char **argv;

  kind = check_request (r, err, errlen);
  if (kind == NULL)
    return NULL;
  if (mloop_nbd_address_parse (r->listen, MLOOP_NBD_ADDRESS_LISTEN, &a,
                               why, sizeof why) == -1) {
    mloop_fail (err, errlen, "--listen %s", why);
    return NULL;
  }
  /* mloop-server would take tcp::PORT as every address: serve listens
   * only where it is told.
   */
  if (a.host && *a.host == '\0') {
    mloop_fail (err, errlen, "--listen %s: needs a HOST (0.0.0.0 or [::] "
                "for every address)", r->listen);
    mloop_nbd_address_clear (&a);
    return NULL;
  }
  if (a.unix_path && !prepare_unix_dir (a.unix_path, err, errlen)) {
    mloop_nbd_address_clear (&a);
    return NULL;
  }

  c = (struct mloop_server_config) {
    .image = r->file, .offset = r->offset, .sizelimit = r->sizelimit,
    .listen = &a, .export_name = r->export_name,
    .threads = r->threads, .read_only = r->read_only, .foreground = true,
    .max_connections = r->max_connections,
    .max_per_client = r->max_per_client, .keepalive = r->keepalive,
    .tls = r->tls, .tls_psk = r->tls_psk,
    .tls_certificates = r->tls_certificates,
    .tls_verify_peer = r->tls_verify_peer,
  };
  argv = mloop_server_command (kind, &c);
  mloop_nbd_address_clear (&a);
  return argv;
}
