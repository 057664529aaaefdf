/* mloop-server — loading the TLS module.  See tls.h. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>

#include "module_path.h"
#include "tls.h"

#define MODULE "mloop-server-tls.so"

int
tls_load (const struct tls_options *o, tls_start_fn **start, char *err,
          size_t errlen)
{
  char path[PATH_MAX];
  tls_setup_fn *setup;
  void *module;

  mloop_module_path (MODULE, "MLOOP_SERVER_TLS_MODULE", path, sizeof path);
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
