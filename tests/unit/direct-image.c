/* An image file for the engine's unit tests.  See direct-image.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "direct-image.h"
#include "unit.h"

#define IMAGE_DIR "/var/tmp"

const char *
direct_image_open (struct mloop_engine *e, const unsigned char *contents,
                   size_t size)
{
  static char path[4096];
  struct mloop_engine_config cfg;
  const struct mloop_backing *b;
  char err[256];
  int fd;

  snprintf (path, sizeof path, "%s/disk.img", unit_tmpdir (IMAGE_DIR));
  fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  CHECK (fd >= 0, "%s: %s", path, strerror (errno));
  CHECK (write (fd, contents, size) == (ssize_t) size, "writing %s: %s",
         path, strerror (errno));
  CHECK (fsync (fd) == 0 && close (fd) == 0, "%s: %s", path, strerror (errno));

  mloop_engine_config_init (&cfg);
  cfg.path = path;
  cfg.direct = MLOOP_DIRECT_AUTO;
  cfg.want_write = true;
  CHECK (mloop_engine_open (e, &cfg, err, sizeof err) == 0, "engine: %s", err);
  b = &direct_image_store (e)->backing;
  if (!b->direct) {
    mloop_engine_close (e);
    unit_skip ("%s refuses O_DIRECT", IMAGE_DIR);
  }
  CHECK (b->writable, "%s opened read-only", path);
  CHECK (b->size == size, "size %llu, expected %zu",
         (unsigned long long) b->size, size);
  /* An aligned size: no page-cache tail, every byte goes through the
   * O_DIRECT descriptor.
   */
  CHECK (b->buffered_from == size, "a page-cache tail at %llu",
         (unsigned long long) b->buffered_from);
  return path;
}

struct mloop_file_store *
direct_image_store (struct mloop_engine *e)
{
  return (struct mloop_file_store *) e->store;
}

void
direct_image_read (const char *path, unsigned char *buf, size_t size)
{
  const size_t align = 65536;   /* any logical block size there is */
  void *aligned;
  ssize_t r;
  int fd;

  CHECK (size % align == 0, "size %zu", size);
  CHECK (posix_memalign (&aligned, align, size) == 0, "out of memory");
  fd = open (path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  CHECK (fd >= 0, "%s: %s", path, strerror (errno));
  r = pread (fd, aligned, size, 0);
  CHECK (r == (ssize_t) size, "reading %s: %zd: %s", path, r,
         strerror (errno));
  close (fd);
  memcpy (buf, aligned, size);
  free (aligned);
}
