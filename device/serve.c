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

static bool
check_request (const struct mloop_serve_request *r, bool *use_nbdkit,
               char *err, size_t errlen)
{
  int fd;

  fd = open (r->file, (r->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd == -1) {
    mloop_fail (err, errlen, "%s: %s", r->file, strerror (errno));
    return false;
  }
  close (fd);
  if (r->listen == NULL) {
    mloop_fail (err, errlen, "--listen unix:PATH or tcp:HOST:PORT is required");
    return false;
  }
  if (r->tls != MLOOP_TLS_OFF && r->server_given &&
      r->server == MLOOP_SERVER_NATIVE) {
    mloop_fail (err, errlen, "the native server has no TLS: use --server nbdkit, "
          "or leave --server out");
    return false;
  }
  if (r->tls != MLOOP_TLS_OFF && !r->tls_psk && !r->tls_certificates) {
    mloop_fail (err, errlen, "--tls needs --tls-psk FILE or --tls-certificates DIR");
    return false;
  }
  if (r->tls_psk && r->tls_certificates) {
    mloop_fail (err, errlen, "--tls-psk and --tls-certificates exclude each other");
    return false;
  }
  if ((r->tls_psk || r->tls_certificates) && r->tls == MLOOP_TLS_OFF) {
    mloop_fail (err, errlen, "--tls-psk/--tls-certificates need --tls on|require");
    return false;
  }
  if (r->tls_psk && access (r->tls_psk, R_OK) == -1) {
    mloop_fail (err, errlen, "--tls-psk %s: %s", r->tls_psk, strerror (errno));
    return false;
  }
  if (r->tls_certificates &&
      !g_file_test (r->tls_certificates, G_FILE_TEST_IS_DIR)) {
    mloop_fail (err, errlen, "--tls-certificates %s: not a directory",
          r->tls_certificates);
    return false;
  }
  *use_nbdkit = r->tls != MLOOP_TLS_OFF ||
    (r->server_given && r->server == MLOOP_SERVER_NBDKIT);
  return true;
}

static void
nbdkit_command (const struct mloop_serve_request *r,
                const struct mloop_nbd_address *a, GPtrArray *argv)
{
  g_ptr_array_add (argv, g_strdup ("nbdkit"));
  g_ptr_array_add (argv, g_strdup ("-f"));
  if (a->unix_path)
    g_ptr_array_add (argv, g_strdup_printf ("--unix=%s", a->unix_path));
  else {
    g_ptr_array_add (argv, g_strdup_printf ("--ipaddr=%s", a->host));
    g_ptr_array_add (argv, g_strdup_printf ("--port=%s", a->port));
  }
  if (r->read_only)
    g_ptr_array_add (argv, g_strdup ("--readonly"));
  if (r->export_name)
    g_ptr_array_add (argv, g_strdup_printf ("--exportname=%s",
                                            r->export_name));
  if (r->tls != MLOOP_TLS_OFF)
    g_ptr_array_add (argv, g_strdup_printf ("--tls=%s",
                     r->tls == MLOOP_TLS_REQUIRE ? "require" : "on"));
  if (r->tls_psk)
    g_ptr_array_add (argv, g_strdup_printf ("--tls-psk=%s", r->tls_psk));
  if (r->tls_certificates)
    g_ptr_array_add (argv, g_strdup_printf ("--tls-certificates=%s",
                                            r->tls_certificates));
  g_ptr_array_add (argv, mloop_locate_program ("MLOOP_PLUGIN",
                                               "plugin/nbdkit-mloop-plugin.so",
                                               "mloop"));
  g_ptr_array_add (argv, g_strdup_printf ("file=%s", r->file));
  if (r->threads)
    g_ptr_array_add (argv, g_strdup_printf ("threads=%u", r->threads));
}

static void
native_command (const struct mloop_serve_request *r, GPtrArray *argv)
{
  g_ptr_array_add (argv, mloop_locate_program ("MLOOP_SERVER_BIN",
                                               "server/mloop-server",
                                               MLOOP_SBINDIR "/mloop-server"));
  g_ptr_array_add (argv, g_strdup_printf ("--listen=%s", r->listen));
  if (r->read_only)
    g_ptr_array_add (argv, g_strdup ("--read-only"));
  if (r->export_name)
    g_ptr_array_add (argv, g_strdup_printf ("--export-name=%s",
                                            r->export_name));
  if (r->threads)
    g_ptr_array_add (argv, g_strdup_printf ("--threads=%u", r->threads));
  g_ptr_array_add (argv, g_strdup ("--"));
  g_ptr_array_add (argv, g_strdup (r->file));
}

char **
mloop_serve_command (const struct mloop_serve_request *r, char *err,
                     size_t errlen)
{
  struct mloop_nbd_address a;
  GPtrArray *argv;
  bool use_nbdkit;
  char why[256];

  if (!check_request (r, &use_nbdkit, err, errlen))
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

  argv = g_ptr_array_new ();
  if (use_nbdkit)
    nbdkit_command (r, &a, argv);
  else
    native_command (r, argv);
  g_ptr_array_add (argv, NULL);
  mloop_nbd_address_clear (&a);
  return (char **) g_ptr_array_free (argv, FALSE);
}
