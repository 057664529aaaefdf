/* mloop — loading mloop-cli-extras.so.  See extras.h. */
#include <dlfcn.h>
#include <limits.h>

#include "extras.h"
#include "module_path.h"
#include "print.h"

#define MODULE "mloop-cli-extras.so"

const struct mloop_cli_extras *
mloop_cli_extras_load (void)
{
  static const struct mloop_cli_extras *extras;
  char path[PATH_MAX];
  void *module;

  if (extras)
    return extras;
  mloop_module_path (MODULE, NULL, path, sizeof path);
  /* Never closed: the command ends soon after. */
  module = dlopen (path, RTLD_NOW | RTLD_LOCAL);
  if (module == NULL) {
    mloop_print_error ("%s did not load (needed to list devices and for "
                       "users who are not root): %s", path, dlerror ());
    return NULL;
  }
  extras = dlsym (module, MLOOP_CLI_EXTRAS_SYMBOL);
  if (extras == NULL)
    mloop_print_error ("%s is not mloop's module (no %s)", path,
                       MLOOP_CLI_EXTRAS_SYMBOL);
  return extras;
}
