/* The RBD store's module is looked for in the build tree beside the
 * program that runs (rbd_load.c), which must be the program itself, not
 * the name it was started by: argv[0] is its caller's to choose (a
 * symbolic link of theirs to /usr/bin/mloop run through sudo, exec -a),
 * and a root `mloop resize` of an RBD device started as
 * /home/USER/bin/mloop must not load /home/USER/engine/mloop-store-rbd.so.
 * The test runs itself again by another name, with a fake module put
 * where that name leads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "rbd_load.h"
#include "unit.h"

#define CHILD_ENV "MLOOP_TEST_RBD_MODULE_CHILD"

static void
copy (const char *from, const char *to)
{
  char buf[65536];
  FILE *in = fopen (from, "rb"), *out = fopen (to, "wb");
  size_t n;

  CHECK (in && out, "copying %s to %s: %s", from, to, strerror (errno));
  while ((n = fread (buf, 1, sizeof buf, in)) > 0)
    CHECK (fwrite (buf, 1, n, out) == n, "writing %s", to);
  fclose (in);
  fclose (out);
  chmod (to, 0755);
}

/* Run by the name the parent chose. */
static int
child (void)
{
  struct mloop_engine_config cfg;
  struct mloop_store *store = NULL;
  char err[512] = "";
  int r;

  mloop_engine_config_init (&cfg);
  cfg.path = "rbd:pool/img:conf=/nonexistent/ceph.conf";
  r = mloop_rbd_store_open (&store, &cfg, err, sizeof err);
  CHECK (r < 0, "opened %s", cfg.path);
  CHECK (strstr (err, "fake module") == NULL, "started as %s, it loaded "
         "the module beside that name: %s", program_invocation_name, err);
  return 0;
}

int
main (int argc, char **argv)
{
  const char *dir, *self = argv[0];
  char *bin, *engine, *module, *name;
  pid_t pid;
  int status;

  (void) argc;
  if (getenv (CHILD_ENV))
    return child ();
  dir = unit_tmpdir ("/var/tmp");
  CHECK (asprintf (&bin, "%s/bin", dir) > 0 &&
         asprintf (&engine, "%s/engine", dir) > 0 &&
         asprintf (&module, "%s/mloop-store-rbd.so", engine) > 0 &&
         asprintf (&name, "%s/mloop", bin) > 0, "no memory");
  CHECK (mkdir (bin, 0755) == 0 && mkdir (engine, 0755) == 0,
         "making %s's directories", dir);
  copy (FAKE_RBD_MODULE, module);
  pid = fork ();
  CHECK (pid >= 0, "fork: %s", strerror (errno));
  if (pid == 0) {
    char *const by_name[] = { name, NULL };

    setenv (CHILD_ENV, "1", 1);
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
