/* mloop-server — loading the TLS module.  See tls.h. */
#include <dlfcn.h>
#include <stdio.h>

#include <glib.h>

#include "tls.h"

#define MODULE "mloop-server-tls.so"

/* $MLOOP_SERVER_TLS_MODULE if set; else the module next to the running
 * program, as in the build tree; else the installed one.
 */
static char *
module_path (void)
{
  const char *env = g_getenv ("MLOOP_SERVER_TLS_MODULE");
  g_autofree char *exe = NULL;
  g_autofree char *dir = NULL;
  char *candidate;

  if (env && *env)
    return g_strdup (env);
  exe = g_file_read_link ("/proc/self/exe", NULL);
  if (exe) {
    dir = g_path_get_dirname (exe);
    candidate = g_build_filename (dir, MODULE, NULL);
    if (g_file_test (candidate, G_FILE_TEST_EXISTS))
      return candidate;
    g_free (candidate);
  }
  return g_strdup (MLOOP_PKGLIBDIR "/" MODULE);
}

int
tls_load (const struct tls_options *o, tls_start_fn **start, char *err,
          size_t errlen)
{
  g_autofree char *path = module_path ();
  tls_setup_fn *setup;
  void *module;

  /* Never closed: its sessions live as long as the server. */
  module = dlopen (path, RTLD_NOW | RTLD_LOCAL);
  if (module == NULL) {
    snprintf (err, errlen, "TLS needs %s, which did not load: %s", path,
              dlerror ());
    return -1;
  }
  setup = (tls_setup_fn *) dlsym (module, "tls_setup");
  *start = (tls_start_fn *) dlsym (module, "tls_start");
  if (setup == NULL || *start == NULL) {
    snprintf (err, errlen, "%s is not mloop-server's TLS module (no "
              "tls_setup or tls_start)", path);
    return -1;
  }
  return setup (o, err, errlen);
}
