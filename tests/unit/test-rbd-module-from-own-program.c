/* The RBD store's module is looked for in the build tree beside the
 * program that runs (rbd_load.c), which must be the program itself, not
 * the name it was started by: argv[0] is its caller's to choose (a
 * symbolic link of theirs to /usr/bin/mloop run through sudo, exec -a),
 * and a root `mloop resize` of an RBD device started as
 * /home/USER/bin/mloop must not load /home/USER/engine/mloop-store-rbd.so.
 * The test runs itself again by another name, with a module file put
 * where that name leads, and asks which file would be loaded (loading
 * one would bring librbd's C++ into a sanitized test, which ASan's
 * interceptors cannot take when the program has no libstdc++ of its
 * own).  About 0.01 s.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "rbd_load.h"
#include "unit.h"

#define CHILD_ENV "MLOOP_TEST_RBD_MODULE_PLANTED"

/* Run by the name the parent chose: fails when the module that would
 * be loaded is the one planted where that name leads.
 */
static int
child (const char *planted)
{
  char path[PATH_MAX];
  struct stat chosen, bad;

  mloop_rbd_module_path (path, sizeof path);
  CHECK (stat (planted, &bad) == 0, "%s: %s", planted, strerror (errno));
  CHECK (stat (path, &chosen) == -1 || chosen.st_dev != bad.st_dev ||
         chosen.st_ino != bad.st_ino, "started as %s, it would load the "
         "module beside that name: %s", program_invocation_name, path);
  return 0;
}

int
main (int argc, char **argv)
{
  const char *dir, *self = argv[0], *planted_env = getenv (CHILD_ENV);
  char *bin, *engine, *module, *name;
  pid_t pid;
  int status, fd;

  (void) argc;
  if (planted_env)
    return child (planted_env);
  dir = unit_tmpdir ("/var/tmp");
  CHECK (asprintf (&bin, "%s/bin", dir) > 0 &&
         asprintf (&engine, "%s/engine", dir) > 0 &&
         asprintf (&module, "%s/mloop-store-rbd.so", engine) > 0 &&
         asprintf (&name, "%s/mloop", bin) > 0, "no memory");
  CHECK (mkdir (bin, 0755) == 0 && mkdir (engine, 0755) == 0,
         "making %s's directories", dir);
  fd = open (module, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  CHECK (fd >= 0, "%s: %s", module, strerror (errno));
  close (fd);
  pid = fork ();
  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    char *const by_name[] = { name, NULL };

    setenv (CHILD_ENV, module, 1);
    unsetenv ("MLOOP_RBD_MODULE");
    /* The test's own path: /proc/self/exe may be valgrind. */
    execv (self, by_name);
    _exit (127);
  }
  CHECK (waitpid (pid, &status, 0) == pid, "waitpid");
  CHECK (WIFEXITED (status) && WEXITSTATUS (status) == 0,
         "started as %s, the test's run failed (status %d)", name, status);
  free (bin);
  free (engine);
  free (module);
  free (name);
  return 0;
}
