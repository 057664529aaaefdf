/* mloop — a server's request counters, shared with `mloop status`. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stats.h"

struct mloop_stats *
mloop_stats_create (const char *path)
{
  struct mloop_stats *s;
  int fd, saved;

  fd = open (path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd == -1)
    return NULL;
  if (ftruncate (fd, sizeof *s) == -1) {
    saved = errno;
    close (fd);
    errno = saved;
    return NULL;
  }
  s = mmap (NULL, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  saved = errno;
  close (fd);                   /* the mapping keeps the file */
  if (s == MAP_FAILED) {
    errno = saved;
    return NULL;
  }
  __atomic_store_n (&s->magic, MLOOP_STATS_MAGIC, __ATOMIC_RELEASE);
  return s;
}

const struct mloop_stats *
mloop_stats_open (const char *path)
{
  const struct mloop_stats *s;
  struct stat st;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    return NULL;
  if (fstat (fd, &st) == -1 || st.st_size < (off_t) sizeof *s) {
    close (fd);
    return NULL;
  }
  s = mmap (NULL, sizeof *s, PROT_READ, MAP_SHARED, fd, 0);
  close (fd);
  if (s == MAP_FAILED)
    return NULL;
  if (__atomic_load_n (&s->magic, __ATOMIC_ACQUIRE) != MLOOP_STATS_MAGIC) {
    munmap ((void *) s, sizeof *s);
    return NULL;
  }
  return s;
}

void
mloop_stats_close (const struct mloop_stats *s)
{
  if (s)
    munmap ((void *) s, sizeof *s);
}

const char *
mloop_stats_command_name (enum mloop_stats_command c)
{
  static const char *const names[MLOOP_STATS_NR_COMMANDS] = {
    "read", "write", "flush", "trim", "zero", "other",
  };

  return c < MLOOP_STATS_NR_COMMANDS ? names[c] : "?";
}
