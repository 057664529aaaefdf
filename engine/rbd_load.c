/* mloop — loading the RBD store module.  See rbd_load.h. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "module_path.h"
#include "rbd_load.h"

#define MODULE "mloop-store-rbd.so"

#ifdef MLOOP_HAVE_RBD

/* The build tree's module: this object is linked into a front end in a
 * sibling of engine/ (server/, ublk/, plugin/).  Empty when not found.
 * The front end is the file that holds this object: a shared object's
 * (the plugin) as it was loaded, else the program's as the kernel runs
 * it (mloop_program_dir), not the name dladdr gives a program.
 */
static void
build_tree_module (char *path, size_t len)
{
  char dir[PATH_MAX];
  const char *slash;
  struct link_map *map = NULL;
  Dl_info info;

  path[0] = '\0';
  if (dladdr1 ((void *) mloop_rbd_store_open, &info, (void **) &map,
               RTLD_DL_LINKMAP) == 0 || map == NULL)
    return;
  if (map->l_name && map->l_name[0]) {
    if ((slash = strrchr (map->l_name, '/')) == NULL)
      return;
    snprintf (dir, sizeof dir, "%.*s", (int) (slash - map->l_name),
              map->l_name);
  }
  else if (mloop_program_dir (dir, sizeof dir) != 0)
    return;
  if (snprintf (path, len, "%s/../engine/%s", dir, MODULE) >= (int) len ||
      access (path, R_OK) != 0)
    path[0] = '\0';
}

void
mloop_rbd_module_path (char *path, size_t len)
{
  const char *env = getenv ("MLOOP_RBD_MODULE");

  if (env && *env) {
    snprintf (path, len, "%s", env);
    return;
  }
  build_tree_module (path, len);
  if (path[0] == '\0')
    snprintf (path, len, "%s/%s", MLOOP_PKGLIBDIR, MODULE);
}

int
mloop_rbd_store_open (struct mloop_store **out,
                      const struct mloop_engine_config *cfg,
                      char *err, size_t errlen)
{
  static void *module;          /* never closed: stores live in it */
  char path[PATH_MAX];
  mloop_rbd_open_fn *open_fn;

  mloop_rbd_module_path (path, sizeof path);
  if (module == NULL)
    module = dlopen (path, RTLD_NOW | RTLD_LOCAL);
  if (module == NULL) {
    snprintf (err, errlen, "%s: RBD images need %s, which did not load: %s",
              cfg->path, path, dlerror ());
    return -ENOENT;
  }
  open_fn = (mloop_rbd_open_fn *) dlsym (module, MLOOP_RBD_OPEN_SYMBOL);
  if (open_fn == NULL) {
    snprintf (err, errlen, "%s is not mloop's RBD module (no %s)", path,
              MLOOP_RBD_OPEN_SYMBOL);
    return -ENOENT;
  }
  return open_fn (out, cfg, err, errlen);
}

#else

int
mloop_rbd_store_open (struct mloop_store **out,
                      const struct mloop_engine_config *cfg,
                      char *err, size_t errlen)
{
  snprintf (err, errlen, "%s: this mloop was built without RBD support "
            "(librbd; Debian: librbd-dev)", cfg->path);
  return -ENOTSUP;
}

#endif
