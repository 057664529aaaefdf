/* QEMU does not open for writing an image an mloop store serves, the
 * base under overlays above all, and still reads it (engine/fileio.c,
 * engine/file_store.c).  QEMU's tools lock bytes 100 to 299 of every
 * image they open: byte 100 + P while they hold permission P, byte
 * 200 + P while they refuse it to others; before taking P they test
 * byte 200 + P, and before refusing P byte 100 + P, for any lock of
 * another's.  Permission 1 is "write".  An overlay reads its base's
 * unwritten clusters for as long as it exists: a virtual machine or
 * qemu-img writing the base changes every overlay device's contents
 * under it.  So a store refuses QEMU writers in QEMU's own terms, a
 * read lock on byte 201, while qemu-img info and map, which take no
 * write permission, still see nothing held on the bytes they test.
 *
 * Here a file store serves the image under an overlay, and a second
 * descriptor tests the bytes as QEMU would.  No root, no QEMU, no
 * clock: about 0.03 s, in the unit suite of every tier
 * (tests/interop/test-qemu-img.py does it with qemu-io itself).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "file_store.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)
#define QEMU_PERM_BYTE(p) (100 + (p))
#define QEMU_SHARED_BYTE(p) (200 + (p))
#define QEMU_PERM_CONSISTENT_READ 0
#define QEMU_PERM_WRITE 1

/* Whether another's lock is on byte AT of FD's file, as QEMU tests it. */
static bool
held_by_another (int fd, off_t at)
{
  struct flock probe = {
    .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1,
  };

  CHECK (fcntl (fd, F_OFD_GETLK, &probe) == 0, "F_OFD_GETLK: %s",
         strerror (errno));
  return probe.l_type != F_UNLCK;
}

static void
check_qemu_sees (const char *image, const char *overlay)
{
  struct mloop_engine_config cfg;
  struct mloop_store *store = NULL;
  char err[512];
  int qemu, r;

  mloop_engine_config_init (&cfg);
  cfg.path = image;
  cfg.direct = MLOOP_DIRECT_OFF;
  cfg.want_write = true;
  cfg.overlay = overlay;
  r = mloop_file_store_open (&store, &cfg, err, sizeof err);
  CHECK (r == 0, "store: %s", err);
  qemu = open (image, O_RDWR | O_CLOEXEC);
  CHECK (qemu >= 0, "%s: %s", image, strerror (errno));
  CHECK (held_by_another (qemu, QEMU_SHARED_BYTE (QEMU_PERM_WRITE)),
         "QEMU may open %s for writing while a store%s serves it", image,
         overlay ? " with an overlay" : "");
  CHECK (!held_by_another (qemu, QEMU_PERM_BYTE (QEMU_PERM_WRITE)) &&
         !held_by_another (qemu,
                           QEMU_SHARED_BYTE (QEMU_PERM_CONSISTENT_READ)),
         "qemu-img info may not read %s while a store serves it", image);
  close (qemu);
  store->ops->close (store);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], overlay_path[4096];

  unit_deadline (30);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (overlay_path, sizeof overlay_path, "%s/overlay", dir);
  unit_make_image (base_path, BASE_SIZE);
  check_qemu_sees (base_path, overlay_path);
  check_qemu_sees (base_path, NULL);
  return 0;
}
