/* Reusing a dead server's counters file (counters.h). */
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "counters.h"

struct mloop_stats *
ublk_counters_reopen (const char *path)
{
  struct stat st;
  int fd = open (path, O_RDWR | O_CLOEXEC);

  if (fd < 0)
    return errno == ENOENT ? mloop_stats_create (path) : NULL;
  if (fstat (fd, &st) < 0 || st.st_size != (off_t) sizeof (struct mloop_stats)) {
    close (fd);
    return mloop_stats_create (path);
  }
  struct mloop_stats *s = mmap (NULL, sizeof *s, PROT_READ | PROT_WRITE,
                                MAP_SHARED, fd, 0);
  int saved = errno;
  close (fd);                   /* the mapping keeps the file */
  if (s == MAP_FAILED) {
    errno = saved;
    return NULL;
  }
  if (__atomic_load_n (&s->magic, __ATOMIC_ACQUIRE) != MLOOP_STATS_MAGIC) {
    munmap (s, sizeof *s);
    return mloop_stats_create (path);
  }
  __atomic_store_n (&s->connections, 0, __ATOMIC_RELAXED);
  __atomic_store_n (&s->in_flight, 0, __ATOMIC_RELAXED);
  return s;
}
