/* mloop — the backing store: an image file or a block device. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/fs.h>

#include "align.h"
#include "backing.h"
#include "io_rights.h"
#include "fileio.h"

/* Writes the reason into ERR (if any) and returns -ERRNUM. */
static int __attribute__((format (printf, 4, 5)))
set_error (char *err, size_t errlen, int errnum, const char *fmt, ...)
{
  va_list ap;

  if (err && errlen) {
    va_start (ap, fmt);
    vsnprintf (err, errlen, fmt, ap);
    va_end (ap);
  }
  return -errnum;
}

int
mloop_on_off_parse (const char *str, bool *on)
{
  static const char *const yes[] = { "on", "true", "yes", "1" };
  static const char *const no[] = { "off", "false", "no", "0" };

  for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
    if (strcasecmp (str, yes[i]) == 0)
      return *on = true, 0;
    if (strcasecmp (str, no[i]) == 0)
      return *on = false, 0;
  }
  return -EINVAL;
}

int
mloop_direct_mode_parse (const char *str, enum mloop_direct_mode *mode)
{
  bool on;

  if (strcasecmp (str, "auto") == 0)
    *mode = MLOOP_DIRECT_AUTO;
  else if (mloop_on_off_parse (str, &on) == 0)
    *mode = on ? MLOOP_DIRECT_ON : MLOOP_DIRECT_OFF;
  else
    return -EINVAL;
  return 0;
}

/* Reads the size and logical block size of an open descriptor. */
static int
probe_geometry (struct mloop_backing *b, const struct stat *st,
                char *err, size_t errlen)
{
  if (b->is_block_device) {
    uint64_t size;
    int lbs;

    if (ioctl (b->fd, BLKGETSIZE64, &size) == -1)
      return set_error (err, errlen, errno, "file=%s: BLKGETSIZE64: %s",
                        b->path, strerror (errno));
    if (ioctl (b->fd, BLKSSZGET, &lbs) == -1)
      return set_error (err, errlen, errno, "file=%s: BLKSSZGET: %s",
                        b->path, strerror (errno));
    b->size = size;
    b->logical_block_size = (uint32_t) lbs;
  }
  else {
    b->size = (uint64_t) st->st_size;
    /* A regular file's O_DIRECT alignment is the logical block size of
     * the device under the filesystem; 512 is the universal minimum and
     * probe_direct_alignment() raises it when the device needs more.
     */
    b->logical_block_size = 512;
  }
  if (!mloop_is_power_of_two (b->logical_block_size) ||
      b->logical_block_size > 65536)
    return set_error (err, errlen, EINVAL,
                      "file=%s: unusable logical block size %u",
                      b->path, b->logical_block_size);
  return 0;
}

/* The O_DIRECT alignment the kernel states for the open file (statx
 * STATX_DIOALIGN, Linux 6.1 on ext4, f2fs and xfs), or 0 when it does not
 * say.  Preferred to reading: a read of a hole succeeds at any alignment
 * (iomap zero-fills holes without checking), so the read probe below
 * takes a sparse image on a 4096-byte-sector disk for a 512-byte one.
 */
static uint32_t
stated_direct_alignment (int fd)
{
#ifdef STATX_DIOALIGN
  struct statx stx;

  if (statx (fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align)
    return stx.stx_dio_offset_align > stx.stx_dio_mem_align
      ? stx.stx_dio_offset_align : stx.stx_dio_mem_align;
#endif
  (void) fd;
  return 0;
}

/* For a regular file: the O_DIRECT alignment, at least 512.  The
 * kernel's word where it gives one; else the smallest power of two at
 * which an O_DIRECT read succeeds (filesystems on 4K-sector devices
 * refuse 512).  Returns 0 on success, -1 with errno = EINVAL when no
 * alignment up to 64 KiB works (the filesystem refuses O_DIRECT reads
 * altogether).
 */
static int
probe_direct_alignment (struct mloop_backing *b)
{
  uint32_t a = stated_direct_alignment (b->fd);
  void *buf;

  if (a) {
    b->logical_block_size = a < 512 ? 512 : a;
    return 0;
  }
  if (b->size == 0)
    return 0;
  buf = mloop_alloc_aligned (65536, 65536);
  if (buf == NULL)
    return -1;
  for (a = 512; a <= 65536; a *= 2) {
    if (pread (b->fd, buf, a, 0) >= 0) {
      b->logical_block_size = a;
      mloop_free_aligned (buf, 65536);
      return 0;
    }
    if (errno != EINVAL)
      break;
  }
  mloop_free_aligned (buf, 65536);
  return -1;
}

/* Where the page-cache tail of a file of SIZE bytes may start: the size
 * rounded down to the largest folio the page cache can build.  Folios
 * are naturally aligned and at most PMD-sized (MAX_PAGECACHE_ORDER), so
 * no folio holding a tail byte can hold a byte before this boundary.
 */
static uint64_t
tail_boundary (uint64_t size, uint32_t logical_block_size)
{
  uint64_t folio_max = MLOOP_PAGE_CACHE_FOLIO_MAX;
  long page = sysconf (_SC_PAGESIZE);
  FILE *f = fopen ("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "re");

  if (f) {
    unsigned long long v;

    if (fscanf (f, "%llu", &v) == 1 && mloop_is_power_of_two (v) &&
        v > folio_max)
      folio_max = v;
    fclose (f);
  }
  if (page > 0 && (uint64_t) page > folio_max)
    folio_max = (uint64_t) page;
  if (logical_block_size > folio_max)
    folio_max = logical_block_size;
  return mloop_round_down (size, folio_max);
}

/* The window of a file of FILE_SIZE bytes whose page-cache tail starts
 * at FILE_FROM (file coordinates): its size and its tail's start,
 * relative to the window, in *SIZE and *FROM.  The tail was decided on
 * the whole file: it moves with the window's start and is cut off by its
 * end.  Fails, naming the cause, if B's window cannot be served.
 */
static int
window_geometry (const struct mloop_backing *b, uint64_t file_size,
                 uint64_t file_from, uint64_t *size, uint64_t *from,
                 char *err, size_t errlen)
{
  const uint32_t align = mloop_backing_window_alignment (b);
  const char *why = b->direct ? "O_DIRECT alignment" : "logical block size";

  if (b->offset > 0 && b->offset >= file_size)
    return set_error (err, errlen, EINVAL, "offset %" PRIu64 " is not "
                      "inside the image (%s is %" PRIu64 " bytes)",
                      b->offset, b->path, file_size);
  if (!mloop_is_aligned (b->offset, align))
    return set_error (err, errlen, EINVAL, "offset %" PRIu64 " is not a "
                      "multiple of the image's %u-byte %s", b->offset,
                      align, why);
  *size = file_size - b->offset;
  if (b->sizelimit && b->sizelimit < *size) {
    /* A window ending inside the file ends on a block boundary, like the
     * loop driver's, which counts whole sectors: its last block is then
     * whole, so no write of it has to touch a byte outside the window.
     */
    *size = mloop_round_down (b->sizelimit, align);
    if (*size == 0)
      return set_error (err, errlen, EINVAL, "sizelimit %" PRIu64 " is "
                        "below the image's %u-byte %s", b->sizelimit,
                        align, why);
  }
  if (file_from <= b->offset)
    *from = 0;
  else if (file_from - b->offset < *size)
    *from = file_from - b->offset;
  else
    *from = *size;
  return 0;
}

/* Narrows B, open on the whole file, to W. */
static int
apply_window (struct mloop_backing *b, const struct mloop_window *w,
              char *err, size_t errlen)
{
  uint64_t size, from;
  int r;

  if (w == NULL || (w->offset == 0 && w->sizelimit == 0))
    return 0;
  b->offset = w->offset;
  b->sizelimit = w->sizelimit;
  r = window_geometry (b, b->size, b->buffered_from, &size, &from, err,
                       errlen);
  if (r < 0)
    return r;
  b->size = size;
  b->buffered_from = from;
  return 0;
}

int
mloop_backing_named_descriptor (const char *path)
{
  static const char *const prefixes[] = { "/proc/self/fd/", "/dev/fd/" };

  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    size_t len = strlen (prefixes[i]);
    char *end;
    long fd;

    if (strncmp (path, prefixes[i], len) != 0 || path[len] == '\0')
      continue;
    errno = 0;
    fd = strtol (path + len, &end, 10);
    if (*end == '\0' && errno == 0 && fd >= 0 && fd <= INT_MAX)
      return (int) fd;
  }
  return -1;
}

/* Serves the open file at descriptor HELD (mloop_backing_named_descriptor)
 * with what it was opened for.  One open file cannot be O_DIRECT and
 * buffered at once, so O_DIRECT (set with fcntl, on the open file all its
 * duplicates share) is used only when the file needs no page-cache tail.
 */
static int
open_held (struct mloop_backing *b, int held, const struct stat *st,
           enum mloop_direct_mode mode, bool want_write, char *err,
           size_t errlen)
{
  int flags = fcntl (held, F_GETFL);
  uint32_t lbs;
  int r, saved;

  if (flags == -1)
    return set_error (err, errlen, errno, "file=%s: %s", b->path,
                      strerror (errno));
  if ((flags & O_ACCMODE) == O_WRONLY || (flags & O_PATH))
    return set_error (err, errlen, EBADF, "file=%s: the descriptor is not "
                      "open for reading", b->path);
  b->writable = want_write && (flags & O_ACCMODE) == O_RDWR;
  /* Written with what the opener was given, not root's rights. */
  mloop_io_rights_open_file_only ();
  b->buffered_fd = fcntl (held, F_DUPFD_CLOEXEC, 0);
  if (b->buffered_fd == -1)
    return set_error (err, errlen, errno, "file=%s: %s", b->path,
                      strerror (errno));
  b->fd = b->buffered_fd;
  r = probe_geometry (b, st, err, errlen);
  if (r < 0)
    return r;
  b->buffered_from = b->size;
  lbs = b->logical_block_size;
  if (mode != MLOOP_DIRECT_OFF &&
      fcntl (held, F_SETFL, flags | O_DIRECT) == 0 &&
      (b->is_block_device || probe_direct_alignment (b) == 0) &&
      b->size % b->logical_block_size == 0) {
    b->direct = true;
    return 0;
  }
  saved = b->size % b->logical_block_size ? EINVAL : errno;
  b->logical_block_size = lbs;
  if (fcntl (held, F_SETFL, flags & ~O_DIRECT) == -1)
    return set_error (err, errlen, errno, "file=%s: %s", b->path,
                      strerror (errno));
  if (mode == MLOOP_DIRECT_ON)
    return set_error (err, errlen, saved, "direct=on: file=%s, an open "
                      "file of odd size or without O_DIRECT support: %s",
                      b->path, strerror (saved));
  if (mode != MLOOP_DIRECT_OFF)
    b->direct_fallback = true;
  return 0;
}

int
mloop_backing_open (struct mloop_backing *b, const char *path,
                    enum mloop_direct_mode mode, bool want_write,
                    const struct mloop_window *window,
                    char *err, size_t errlen)
{
  const int held = mloop_backing_named_descriptor (path);
  struct stat st;
  int rw_flags, r, looked_up = -1;

  memset (b, 0, sizeof *b);
  b->fd = b->buffered_fd = -1;

  /* The path is looked up once (O_PATH opens nothing) and every open
   * below goes through that lookup: the path may be a user's (the base
   * a user's overlay names, committed by root), and a FIFO or character
   * device swapped in after the type check must not be opened, since
   * opening one is itself an act.
   */
  if (held < 0)
    looked_up = open (path, O_PATH | O_CLOEXEC);
  if (held < 0 && looked_up == -1)
    return set_error (err, errlen, errno, "file=%s: %s", path,
                      strerror (errno));
  if (fstat (held >= 0 ? held : looked_up, &st) == -1) {
    r = set_error (err, errlen, errno, "file=%s: %s", path, strerror (errno));
    goto fail;
  }
  if (S_ISDIR (st.st_mode)) {
    r = set_error (err, errlen, EISDIR, "file=%s: is a directory, not "
                   "an image file or block device", path);
    goto fail;
  }
  if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    r = set_error (err, errlen, EINVAL, "file=%s: not a regular file "
                   "or block device", path);
    goto fail;
  }
  b->path = strdup (path);
  if (b->path == NULL) {
    r = set_error (err, errlen, errno, "file=%s: %s", path, strerror (errno));
    goto fail;
  }
  b->is_block_device = S_ISBLK (st.st_mode);
  if (held >= 0) {
    r = open_held (b, held, &st, mode, want_write, err, errlen);
    if (r < 0)
      goto fail;
    goto window;
  }

  /* Never O_CREAT or O_TRUNC: a mistyped path must not make a file. */
  rw_flags = O_RDONLY;
  b->writable = false;
  if (want_write) {
    b->buffered_fd = mloop_open_looked_up (looked_up, AT_FDCWD, path,
                                           O_RDWR | O_CLOEXEC);
    if (b->buffered_fd >= 0) {
      rw_flags = O_RDWR;
      b->writable = true;
    }
    else if (errno != EACCES && errno != EROFS && errno != EPERM) {
      r = set_error (err, errlen, errno, "file=%s: %s", path,
                     strerror (errno));
      goto fail;
    }
  }
  if (b->buffered_fd == -1) {
    b->buffered_fd = mloop_open_looked_up (looked_up, AT_FDCWD, path,
                                           O_RDONLY | O_CLOEXEC);
    if (b->buffered_fd == -1) {
      r = set_error (err, errlen, errno, "file=%s: %s", path,
                     strerror (errno));
      goto fail;
    }
  }

  b->fd = b->buffered_fd;
  r = probe_geometry (b, &st, err, errlen);
  if (r < 0)
    goto fail;
  b->buffered_from = b->size;

  if (mode != MLOOP_DIRECT_OFF) {
    int dfd = mloop_open_looked_up (looked_up, AT_FDCWD, path,
                                    rw_flags | O_DIRECT | O_CLOEXEC);
    int saved;

    if (dfd >= 0) {
      b->fd = dfd;
      if (b->is_block_device || probe_direct_alignment (b) == 0) {
        b->direct = true;
        if (b->size % b->logical_block_size)
          b->buffered_from = tail_boundary (b->size, b->logical_block_size);
        goto window;
      }
      saved = errno;
      b->fd = b->buffered_fd;
      close (dfd);
      errno = saved;
    }
    if (mode == MLOOP_DIRECT_ON) {
      r = set_error (err, errlen, errno, "direct=on: file=%s does not "
                     "support O_DIRECT: %s", path, strerror (errno));
      goto fail;
    }
    b->direct_fallback = true;
  }

 window:
  r = apply_window (b, window, err, errlen);
  if (r < 0)
    goto fail;
  if (looked_up >= 0)
    close (looked_up);
  return 0;

 fail:
  if (looked_up >= 0)
    close (looked_up);
  mloop_backing_close (b);
  return r;
}

int
mloop_backing_reprobe_size (struct mloop_backing *b, char *err,
                            size_t errlen)
{
  uint64_t file_size, file_from, size, from;
  uint64_t old_size = b->size, old_from = b->buffered_from;
  int r;

  if (b->is_block_device) {
    if (ioctl (b->fd, BLKGETSIZE64, &file_size) == -1)
      return set_error (err, errlen, errno, "file=%s: BLKGETSIZE64: %s",
                        b->path, strerror (errno));
  }
  else {
    struct stat st;

    if (fstat (b->buffered_fd, &st) == -1)
      return set_error (err, errlen, errno, "file=%s: fstat: %s", b->path,
                        strerror (errno));
    file_size = (uint64_t) st.st_size;
  }
  file_from = file_size;
  if (b->direct && file_size % b->logical_block_size)
    file_from = tail_boundary (file_size, b->logical_block_size);
  r = window_geometry (b, file_size, file_from, &size, &from, err, errlen);
  if (r < 0)
    return r;
  /* A tail that existed keeps covering what it covered: its pages may
   * still be in the page cache.
   */
  if (old_from < old_size && old_from < from)
    from = old_from;
  /* The tail first when it grows down, so that no request sees the new
   * size with the old tail.  A request already past its check keeps the
   * path it chose; with an odd size, growing within one folio of the old
   * end is the one case where that can mix the two paths on a page.
   */
  __atomic_store_n (&b->buffered_from, from, __ATOMIC_RELEASE);
  __atomic_store_n (&b->size, size, __ATOMIC_RELEASE);
  return 0;
}

void
mloop_backing_close (struct mloop_backing *b)
{
  if (b->fd >= 0 && b->fd != b->buffered_fd)
    close (b->fd);
  if (b->buffered_fd >= 0)
    close (b->buffered_fd);
  b->fd = b->buffered_fd = -1;
  free (b->path);
  b->path = NULL;
}
