/* mloop — counting the kernel NBD client's running receive works. */
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "nbd_receivers.h"

#define POLL_MS 20

unsigned
mloop_nbd_receivers (int index)
{
  char suffix[32], path[300], comm[64];
  size_t slen;
  unsigned n = 0;
  struct dirent *d;
  DIR *proc = opendir ("/proc");

  if (proc == NULL)
    return 0;
  slen = (size_t) snprintf (suffix, sizeof suffix, "+nbd%d-recv", index);
  while ((d = readdir (proc)) != NULL) {
    FILE *f;
    size_t len;

    if (!isdigit ((unsigned char) d->d_name[0]))
      continue;
    snprintf (path, sizeof path, "/proc/%s/comm", d->d_name);
    f = fopen (path, "re");
    if (f == NULL)
      continue;                 /* the thread has gone */
    if (fgets (comm, sizeof comm, f) != NULL) {
      comm[strcspn (comm, "\n")] = '\0';
      len = strlen (comm);
      if (len >= slen && strcmp (comm + len - slen, suffix) == 0)
        n++;
    }
    fclose (f);
  }
  closedir (proc);
  return n;
}

static void
sleep_ms (unsigned ms)
{
  struct timespec ts = { .tv_sec = ms / 1000,
                         .tv_nsec = (long) (ms % 1000) * 1000000 };

  nanosleep (&ts, NULL);
}

bool
mloop_nbd_receivers_all_running (int index, unsigned n, unsigned settle_ms,
                                 unsigned timeout_ms)
{
  unsigned waited = 0, unchanged = 0, seen, last = 0;

  for (;;) {
    seen = mloop_nbd_receivers (index);
    if (seen >= n)
      return true;
    unchanged = seen == last ? unchanged + POLL_MS : 0;
    last = seen;
    if (waited >= timeout_ms || (seen > 0 && unchanged >= settle_ms))
      return seen == 0;
    sleep_ms (POLL_MS);
    waited += POLL_MS;
  }
}

void
mloop_nbd_receivers_wait_gone (int index, unsigned timeout_ms)
{
  unsigned waited = 0;

  while (mloop_nbd_receivers (index) > 0 && waited < timeout_ms) {
    sleep_ms (POLL_MS);
    waited += POLL_MS;
  }
}
