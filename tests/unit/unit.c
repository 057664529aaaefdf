/* What the unit tests share.  See unit.h. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "unit.h"

#define MAX_PATHS 16

static char *paths[MAX_PATHS];
static volatile sig_atomic_t n_paths;

static int
remove_one (const char *path, const struct stat *st, int type,
            struct FTW *ftw)
{
  remove (path);
  return 0;
}

static void
remove_paths (void)
{
  while (n_paths > 0)
    nftw (paths[--n_paths], remove_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void
remove_paths_at_exit (void)
{
  int n = n_paths;

  remove_paths ();
  while (n > 0)
    free (paths[--n]);
}

/* A test killed, or failing in the code under test, still cleans up.
 * nftw is not async-signal-safe; a test process has nothing else left
 * to do with its heap, and a rare lost directory beats a certain one.
 */
static void
on_signal (int sig)
{
  if (sig == SIGALRM) {
    static const char msg[] = "FAIL: deadline passed: the test hangs\n";
    ssize_t r = write (STDERR_FILENO, msg, sizeof msg - 1);

    (void) r;
  }
  remove_paths ();
  signal (sig, SIG_DFL);
  raise (sig);
}

static void
install_handlers (void)
{
  static int installed;
  const int sigs[] = { SIGABRT, SIGALRM, SIGTERM, SIGINT, SIGSEGV, SIGBUS };

  if (installed++)
    return;
  atexit (remove_paths_at_exit);
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
    signal (sigs[i], on_signal);
}

void
unit_remove_at_exit (const char *path)
{
  install_handlers ();
  if (n_paths == MAX_PATHS) {
    fprintf (stderr, "unit_remove_at_exit: more than %d paths\n", MAX_PATHS);
    exit (1);
  }
  paths[n_paths] = strdup (path);
  if (paths[n_paths] == NULL) {
    perror ("strdup");
    exit (1);
  }
  n_paths++;
}

const char *
unit_tmpdir (const char *base)
{
  char dir[4096];

  snprintf (dir, sizeof dir, "%s/mloop-unit-XXXXXX", base);
  if (mkdtemp (dir) == NULL)
    unit_skip ("cannot make a directory in %s: %s", base, strerror (errno));
  unit_remove_at_exit (dir);
  return paths[n_paths - 1];
}

void
unit_make_image (const char *path, unsigned long long size)
{
  int fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

  CHECK (fd >= 0 && ftruncate (fd, (off_t) size) == 0 && close (fd) == 0,
         "%s: %s", path, strerror (errno));
}

void
unit_sleep_ms (unsigned ms)
{
  struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

void
unit_deadline (unsigned seconds)
{
  install_handlers ();
  alarm (seconds);
}

void
unit_fail (const char *file, int line, const char *cond, const char *fmt, ...)
{
  va_list ap;

  fprintf (stderr, "FAIL: %s:%d: %s: ", file, line, cond);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  exit (1);
}

void
unit_skip (const char *fmt, ...)
{
  va_list ap;

  printf ("SKIP: ");
  va_start (ap, fmt);
  vprintf (fmt, ap);
  va_end (ap);
  putchar ('\n');
  exit (77);
}
