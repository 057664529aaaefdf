/* A stand-in for mloop-store-rbd.so that says it was loaded: what a
 * user could put beside a path they chose (test-rbd-module-from-own-
 * program.c).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>

struct mloop_store;
struct mloop_engine_config;

int mloop_rbd_store_module_open (struct mloop_store **out,
                                 const struct mloop_engine_config *cfg,
                                 char *err, size_t errlen);

int
mloop_rbd_store_module_open (struct mloop_store **out,
                             const struct mloop_engine_config *cfg,
                             char *err, size_t errlen)
{
  (void) out;
  (void) cfg;
  snprintf (err, errlen, "the fake module was loaded");
  return -EXDEV;
}
