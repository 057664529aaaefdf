/* What the overlay unit tests share (overlay_fixture.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "align.h"
#include "backing.h"
#include "overlay_fixture.h"
#include "range_lock.h"
#include "unit.h"

void
unit_runtime_dir (const char *dir)
{
  char run[4096];

  snprintf (run, sizeof run, "%s/run", dir);
  CHECK (mkdir (run, 0700) == 0, "%s: %s", run, strerror (errno));
  setenv ("MLOOP_RUNTIME_DIR", run, 1);
}

void
unit_open_overlay (struct mloop_backing *base, struct mloop_overlay *ov,
                   const char *base_path, const char *path)
{
  char err[512];
  int r;

  r = mloop_backing_open (base, base_path, MLOOP_DIRECT_OFF, false, NULL,
                          err, sizeof err);
  CHECK (r == 0, "base: %s", err);
  r = mloop_overlay_open (ov, path, base, false, MLOOP_OVERLAY_SAME_BASE,
                          err, sizeof err);
  CHECK (r == 0, "overlay: %s", err);
}

void
unit_make_empty_overlay (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;

  unit_open_overlay (&base, &ov, base_path, path);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

void
unit_write_cluster (const char *base_path, const char *path, uint64_t at)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  struct mloop_range_lock lock;
  char *buf = mloop_alloc_aligned (MLOOP_OVERLAY_CLUSTER,
                                   MLOOP_OVERLAY_CLUSTER);
  int r;

  CHECK (buf != NULL, "no memory");
  unit_open_overlay (&base, &ov, base_path, path);
  mloop_range_lock_init (&lock);
  memset (buf, 0x5a, MLOOP_OVERLAY_CLUSTER);
  r = mloop_overlay_rw (&ov, &base, &lock, true, buf, MLOOP_OVERLAY_CLUSTER,
                        at, false);
  CHECK (r == 0, "write: %s", strerror (-r));
  mloop_range_lock_destroy (&lock);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  mloop_free_aligned (buf, MLOOP_OVERLAY_CLUSTER);
}

void
unit_make_overlay (const char *base_path, const char *path)
{
  unit_write_cluster (base_path, path, UNIT_OVERLAY_CLUSTER_AT);
}

void
unit_make_tagged_image (const char *path, uint64_t size, const char *tag)
{
  const ssize_t len = (ssize_t) strlen (tag);
  int fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

  CHECK (fd >= 0 && ftruncate (fd, (off_t) size) == 0 &&
         pwrite (fd, tag, (size_t) len, 0) == len && close (fd) == 0,
         "%s: %s", path, strerror (errno));
}

unsigned char
unit_byte_at (const char *path, off_t at)
{
  unsigned char b = 0;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &b, 1, at) == 1 && close (fd) == 0,
         "%s: %s", path, strerror (errno));
  return b;
}

uint64_t
unit_get_u64 (const char *path, off_t at)
{
  uint64_t v = 0;
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pread (fd, &v, sizeof v, at) == (ssize_t) sizeof v &&
         close (fd) == 0, "%s: %s", path, strerror (errno));
  return v;
}

void
unit_put_u64 (const char *path, off_t at, uint64_t value)
{
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  CHECK (fd >= 0 && pwrite (fd, &value, sizeof value, at) ==
         (ssize_t) sizeof value && close (fd) == 0, "%s: %s", path,
         strerror (errno));
}

int
unit_try_open_window (const char *base_path, const struct mloop_window *window,
                      const char *path, enum mloop_overlay_base_check check,
                      char *err, size_t errlen)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  int r;

  r = mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, false, window,
                          err, errlen);
  CHECK (r == 0, "base: %s", err);
  r = mloop_overlay_open (&ov, path, &base, false, check, err, errlen);
  if (r == 0)
    mloop_overlay_close (&ov);
  mloop_backing_close (&base);
  return r;
}

int
unit_try_open_overlay (const char *base_path, const char *path,
                       enum mloop_overlay_base_check check, char *err,
                       size_t errlen)
{
  return unit_try_open_window (base_path, NULL, path, check, err, errlen);
}

void
unit_renumber_base_device (const char *path)
{
  unit_put_u64 (path, UNIT_HDR_BASE_DEV,
                unit_get_u64 (path, UNIT_HDR_BASE_DEV) + 1);
}

void
unit_mark_merging (const char *base_path, const char *path)
{
  struct mloop_backing base;
  struct mloop_overlay ov;
  char err[512];

  unit_open_overlay (&base, &ov, base_path, path);
  CHECK (mloop_overlay_note_merging (&ov, &base, err, sizeof err) == 0,
         "mark: %s", err);
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

void
unit_stop_commit (const char *path, const char *base_path,
                  enum mloop_overlay_base_check check)
{
  const struct mloop_window whole = { 0, 0 };
  struct mloop_backing base;
  struct mloop_overlay ov;
  char cluster[MLOOP_OVERLAY_CLUSTER];
  char err[512];

  CHECK (mloop_backing_open (&base, base_path, MLOOP_DIRECT_OFF, true, &whole,
                             err, sizeof err) == 0, "base: %s", err);
  CHECK (mloop_overlay_open (&ov, path, &base, false, check, err,
                             sizeof err) == 0,
         "a commit refused the base it should take: %s", err);
  CHECK (mloop_overlay_note_merging (&ov, &base, err, sizeof err) == 0,
         "mark: %s", err);
  memset (cluster, 0x5a, sizeof cluster);
  CHECK (pwrite (base.fd, cluster, sizeof cluster, UNIT_OVERLAY_CLUSTER_AT)
         == (ssize_t) sizeof cluster && fsync (base.fd) == 0,
         "write: %s", strerror (errno));
  mloop_overlay_close (&ov);
  mloop_backing_close (&base);
}

void
unit_copy_file (const char *from, const char *to)
{
  static char buf[1 << 16];
  int in = open (from, O_RDONLY | O_CLOEXEC);
  int out = open (to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ssize_t n;

  CHECK (in >= 0 && out >= 0, "copying %s: %s", from, strerror (errno));
  while ((n = read (in, buf, sizeof buf)) > 0)
    CHECK (write (out, buf, (size_t) n) == n, "%s: %s", to, strerror (errno));
  CHECK (n == 0 && close (out) == 0, "%s: %s", to, strerror (errno));
  close (in);
}

bool
unit_still_marks (const char *path, const char *base_path)
{
  char *recorded = NULL;
  uint64_t size;
  bool known, merging = false, marks;
  char err[512];
  int fd = open (path, O_RDONLY | O_CLOEXEC), r;

  CHECK (fd >= 0, "%s: %s", path, strerror (errno));
  r = mloop_overlay_inspect_fd (fd, path, &recorded, &size, &known,
                                &merging, err, sizeof err);
  CHECK (r == 0, "inspect: %s", err);
  close (fd);
  marks = merging && strcmp (recorded, base_path) == 0;
  free (recorded);
  return marks;
}

int
unit_commit_in_child (const char *path, const char *base_path,
                      int (*enter) (void *arg), void *arg, const char *needle)
{
  char err[1024];
  int status, r;
  pid_t pid = fork ();

  CHECK (pid != -1, "fork: %s", strerror (errno));
  if (pid == 0) {
    if ((r = enter (arg)) != 0)
      _exit (r);
    r = mloop_overlay_merge (path, base_path, false, true, err, sizeof err);
    if (r == 0)
      printf ("committed\n");
    else
      printf ("refused: %s\n", err);
    fflush (stdout);
    _exit (r == 0 ? 0 : needle && strstr (err, needle) ? 1 : 2);
  }
  CHECK (waitpid (pid, &status, 0) == pid && WIFEXITED (status),
         "the commit in a child process did not end");
  return WEXITSTATUS (status);
}

void
unit_make_version_1 (const char *path, const char *name)
{
  char tail[4096 - 64];
  const uint32_t version = 1;
  int fd = open (path, O_WRONLY | O_CLOEXEC);

  memset (tail, 0, sizeof tail);
  memcpy (tail, name, strlen (name));
  CHECK (fd >= 0 && pwrite (fd, &version, sizeof version, 8) ==
         (ssize_t) sizeof version &&
         pwrite (fd, tail, sizeof tail, 64) == (ssize_t) sizeof tail &&
         close (fd) == 0, "%s: %s", path, strerror (errno));
}
