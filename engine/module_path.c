/* mloop — where mloop's loadable modules are.  See module_path.h. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "module_path.h"

void
mloop_module_path (const char *module, const char *env_var, char *path,
                   size_t len)
{
  const char *env = env_var ? getenv (env_var) : NULL;
  char exe[PATH_MAX];
  ssize_t n;
  char *slash;

  if (env && *env) {
    snprintf (path, len, "%s", env);
    return;
  }
  /* Only the running program's own directory: whoever may write there
   * may replace the program as well.
   */
  n = readlink ("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
    slash = strrchr (exe, '/');
    if (slash) {
      snprintf (path, len, "%.*s/%s", (int) (slash - exe), exe, module);
      if (access (path, R_OK) == 0)
        return;
    }
  }
  snprintf (path, len, "%s/%s", MLOOP_PKGLIBDIR, module);
}
