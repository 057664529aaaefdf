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

/* Splits "tcp:ADDR:PORT" (ADDR may be "[v6]") into *HOST and *PORT. */
static bool
split_tcp (const char *spec, char **host, char **port)
{
  const char *colon = strrchr (spec, ':');
  const char *end;

  if (colon == NULL || colon == spec || colon[1] == '\0')
    return false;
  for (end = colon + 1; *end; end++)
    if (!g_ascii_isdigit (*end))
      return false;
  *host = g_strndup (spec, colon - spec);
  if ((*host)[0] == '[' && (*host)[strlen (*host) - 1] == ']') {
    char *bare = g_strndup (*host + 1, strlen (*host) - 2);

    g_free (*host);
    *host = bare;
  }
  *port = g_strdup (colon + 1);
  return true;
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
    mloop_fail (err, errlen, "--listen unix:PATH or tcp:ADDR:PORT is required");
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
nbdkit_command (const struct mloop_serve_request *r, const char *host,
                const char *port, GPtrArray *argv)
{
  g_ptr_array_add (argv, g_strdup ("nbdkit"));
  g_ptr_array_add (argv, g_strdup ("-f"));
  if (host) {
    g_ptr_array_add (argv, g_strdup_printf ("--ipaddr=%s", host));
    g_ptr_array_add (argv, g_strdup_printf ("--port=%s", port));
  }
  else
    g_ptr_array_add (argv, g_strdup_printf ("--unix=%s", r->listen + 5));
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
  g_autofree char *host = NULL, *port = NULL;
  GPtrArray *argv;
  bool use_nbdkit;

  if (!check_request (r, &use_nbdkit, err, errlen))
    return NULL;
  if (g_str_has_prefix (r->listen, "unix:")) {
    if (r->listen[5] == '\0') {
      mloop_fail (err, errlen, "--listen unix: needs a PATH");
      return NULL;
    }
    if (!prepare_unix_dir (r->listen + 5, err, errlen))
      return NULL;
  }
  else if (!g_str_has_prefix (r->listen, "tcp:") ||
           !split_tcp (r->listen + 4, &host, &port)) {
    mloop_fail (err, errlen, "--listen %s: expected unix:PATH or "
                "tcp:ADDR:PORT", r->listen);
    return NULL;
  }

  argv = g_ptr_array_new ();
  if (use_nbdkit)
    nbdkit_command (r, host, port, argv);
  else
    native_command (r, argv);
  g_ptr_array_add (argv, NULL);
  return (char **) g_ptr_array_free (argv, FALSE);
}
