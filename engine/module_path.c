/* mloop — where mloop's loadable modules are.  See module_path.h. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "module_path.h"

int
mloop_program_dir (char *dir, size_t len)
{
  ssize_t n = readlink ("/proc/self/exe", dir, len - 1);
  char *slash;

  if (n <= 0 || (size_t) n >= len - 1)
    return -1;
  dir[n] = '\0';
  slash = strrchr (dir, '/');
  if (slash == NULL)
    return -1;
  *slash = '\0';
  return 0;
}

void
mloop_module_path (const char *module, const char *env_var, char *path,
                   size_t len)
{
  const char *env = env_var ? getenv (env_var) : NULL;
  char dir[PATH_MAX];

  if (env && *env) {
    snprintf (path, len, "%s", env);
    return;
  }
  /* Only the running program's own directory: whoever may write there
   * may replace the program as well.
   */
  if (mloop_program_dir (dir, sizeof dir) == 0) {
    snprintf (path, len, "%s/%s", dir, module);
    if (access (path, R_OK) == 0)
      return;
  }
  snprintf (path, len, "%s/%s", MLOOP_PKGLIBDIR, module);
}
