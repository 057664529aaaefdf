/* A process that may only read an image cannot keep servers off it
 * (engine/file_store.c, engine/overlay_merge.c).  Every file store
 * holds its image locked shared, and `mloop overlay commit` locks the
 * base exclusively, so that no server reads or writes it during the
 * merge.  Were that lock one any opener may take (flock(), which
 * asks nothing of the descriptor's mode), any user allowed to read a
 * shared base image could hold it exclusively and keep root's servers
 * off it: no attach, and no restart of a device's server.  The
 * exclusive lock must need a descriptor open for writing.
 *
 * Here a descriptor open only for reading takes the strongest lock it
 * can, both flock() and a read lock (the merge's write lock refuses it
 * anyway); a file store must still open the image, plain and under an
 * overlay, and a commit into it must still be refused while a store
 * holds it.  No root, no clock: about 0.03 s, in the unit suite of
 * every tier.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "engine.h"
#include "file_store.h"
#include "overlay.h"
#include "overlay_fixture.h"
#include "unit.h"

#define BASE_SIZE (1u << 20)

static void
open_store (const char *image, const char *overlay)
{
  struct mloop_engine_config cfg;
  struct mloop_store *store = NULL;
  char err[512];
  int r;

  mloop_engine_config_init (&cfg);
  cfg.path = image;
  cfg.direct = MLOOP_DIRECT_OFF;
  cfg.want_write = true;
  cfg.overlay = overlay;
  r = mloop_file_store_open (&store, &cfg, err, sizeof err);
  CHECK (r == 0, "a reader's lock kept a store%s off the image: %s",
         overlay ? " with an overlay" : "", err);
  store->ops->close (store);
}

int
main (void)
{
  const char *dir = unit_tmpdir ("/var/tmp");
  char base_path[4096], overlay_path[4096], other_path[4096], err[512];
  struct mloop_engine_config cfg;
  struct mloop_store *store = NULL;
  struct flock rd = { .l_type = F_RDLCK, .l_whence = SEEK_SET };
  struct flock wr = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
  int reader, r;

  unit_deadline (30);
  unit_runtime_dir (dir);
  snprintf (base_path, sizeof base_path, "%s/base.img", dir);
  snprintf (overlay_path, sizeof overlay_path, "%s/overlay", dir);
  snprintf (other_path, sizeof other_path, "%s/other", dir);
  unit_make_image (base_path, BASE_SIZE);
  unit_make_overlay (base_path, other_path);

  /* The reader: what a user who may only read the image can hold. */
  reader = open (base_path, O_RDONLY | O_CLOEXEC);
  CHECK (reader >= 0, "%s: %s", base_path, strerror (errno));
  CHECK (flock (reader, LOCK_EX | LOCK_NB) == 0, "flock: %s",
         strerror (errno));
  CHECK (fcntl (reader, F_OFD_SETLK, &wr) == -1 && errno == EBADF,
         "a descriptor open for reading took a write lock");
  CHECK (fcntl (reader, F_OFD_SETLK, &rd) == 0, "F_OFD_SETLK: %s",
         strerror (errno));

  open_store (base_path, NULL);
  open_store (base_path, overlay_path);
  close (reader);

  /* The lock still does its work: no commit while a store holds it. */
  mloop_engine_config_init (&cfg);
  cfg.path = base_path;
  cfg.direct = MLOOP_DIRECT_OFF;
  r = mloop_file_store_open (&store, &cfg, err, sizeof err);
  CHECK (r == 0, "store: %s", err);
  r = mloop_overlay_merge (other_path, base_path, false, true, err,
                           sizeof err);
  CHECK (r < 0, "a commit wrote the base while a store served it");
  store->ops->close (store);
  r = mloop_overlay_merge (other_path, base_path, false, true, err,
                           sizeof err);
  CHECK (r == 0, "commit once the store closed: %s", err);
  return 0;
}
