/* Preloaded with the ASan runtime into nbdkit (which is not built with
 * ASan) under `meson test --setup=asan`, so the runtime initializes before
 * any library's constructor runs.
 *
 * Why: a preloaded runtime initializes lazily, on the process's first
 * malloc.  In nbdkit that malloc is made by libp11-kit's constructor
 * inside newlocale(), which holds glibc's locale lock; ASan's
 * initialization then calls dlerror(), whose gettext takes and releases
 * the same lock, releasing newlocale's hold on it.  The lock is left
 * corrupt, and nbdkit hangs at exit in p11-kit's destructor (freelocale)
 * or after its first strerror.  This object is linked with -z initfirst,
 * so glibc runs its constructor before every other one, and the malloc
 * below (the runtime's) initializes ASan while no lock is held.
 */
#include <stdlib.h>

static void __attribute__((constructor))
asan_first (void)
{
  free (malloc (1));
}
