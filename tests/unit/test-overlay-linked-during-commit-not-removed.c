/* `mloop overlay commit` never reports an overlay gone while a name
 * given to it during the merge keeps it.
 *
 * The commit refuses an overlay with a second name (a hard link), but
 * it counted the names before the merge, which may take minutes, and a
 * snapshot of the overlay's directory (`cp -al`, rsnapshot from cron)
 * may be taken during it.  The commit unlinked its one name, said the
 * overlay was committed and gone, and the snapshot's name kept it,
 * merged and marked: discard refuses it and advises the commit, which
 * would write its old clusters over whatever the base was given since.
 * The names are counted again once the merge is done, before the
 * unlink.
 *
 * This program's pwritev2() stands in for the C library's (the engine
 * and device code are linked in statically): it links the overlay to a
 * second name when the commit first writes into the base.  No root:
 * about 0.05 s.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "overlay.h"
#include "overlay_file.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static char base_path[4096], path[4096], snapshot_path[4096];
static bool link_at_write;

ssize_t
pwritev2 (int fd, const struct iovec *iov, int iovcnt, off_t offset,
          int flags)
{
  struct stat st, base_st;

  if (link_at_write && fstat (fd, &st) == 0 &&
      stat (base_path, &base_st) == 0 && st.st_dev == base_st.st_dev &&
      st.st_ino == base_st.st_ino) {
    link_at_write = false;
    CHECK (link (path, snapshot_path) == 0, "%s: %s", snapshot_path,
           strerror (errno));
  }
  return syscall (SYS_pwritev2, fd, iov, iovcnt, (long) offset, 0L, flags);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char err[1024], *written = NULL;
  int r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (path, sizeof path, "%s/overlay", dir);
  snprintf (snapshot_path, sizeof snapshot_path, "%s/snapshot.overlay", dir);
  unit_make_image (base_path, BASE_SIZE);

  unit_make_overlay (base_path, path);
  link_at_write = true;
  r = mloop_overlay_file_commit (path, NULL, false, &written, err,
                                 sizeof err);
  free (written);
  CHECK (access (snapshot_path, F_OK) == 0, "the commit never wrote into "
         "the base");
  CHECK (r != 0, "the commit succeeded, but the overlay stays under the "
         "name %s given it during the merge", snapshot_path);
  CHECK (strstr (err, "names") != NULL, "the commit's error does not say "
         "the overlay has other names: %s", err);
  CHECK (unit_byte_at (base_path, UNIT_OVERLAY_CLUSTER_AT) == 0x5a,
         "the commit did not write the base");

  printf ("ok: an overlay given another name during a commit is not "
          "removed, and the commit says why: %s\n", err);
  return 0;
}
