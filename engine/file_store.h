/* mloop — the file store: an image file or block device served through
 * kernel AIO on an O_DIRECT descriptor (store.h's first kind).
 *
 * It decides how each request reaches the disk: AIO on the O_DIRECT
 * descriptor, a bounce buffer, a read-modify-write (unaligned.c), the
 * page-cache tail of an odd-sized file, or the copy-on-write overlay
 * (overlay.h) in front of a read-only base.  Trim, zero and extents are
 * space.c's.  Internal to the engine: front ends use engine.h.
 */
#ifndef MLOOP_FILE_STORE_H
#define MLOOP_FILE_STORE_H

#include <stdbool.h>

#include "backing.h"
#include "overlay.h"
#include "range_lock.h"
#include "store.h"

struct mloop_engine_config;

struct mloop_file_store {
  struct mloop_store base;
  /* The file served: with an overlay, the read-only base, though
   * backing.writable then says whether the device takes writes (they go
   * to the overlay) and backing.logical_block_size is at least the
   * overlay's cluster, the alignment of its fast path.
   */
  struct mloop_backing backing;
  struct mloop_overlay *overlay;        /* NULL: none */
  /* Kernel features, probed by the store's probe_features. */
  bool fua_in_aio;              /* RWF_DSYNC on AIO writes (Linux ≥ 4.13) */
  bool flush_in_aio;            /* IOCB_CMD_FDSYNC (Linux ≥ 4.18) */
  /* A plain image's failed writeback the flush probe's sync was told
   * of (a server before this one killed before it synced), for the
   * first FLUSH to report (negative errno), or 0.
   */
  int probe_sync_error;
  /* Serializes read-modify-write of partial blocks (unaligned.c). */
  struct mloop_range_lock rmw_lock;
};

/* Opens CFG's file (and overlay) as *OUT.  0, or a negative errno with a
 * one-line reason in ERR.
 */
int mloop_file_store_open (struct mloop_store **out,
                           const struct mloop_engine_config *cfg,
                           char *err, size_t errlen);

/* space.c: the store's trim, zero and extents operations (store.h),
 * for a file store only, with space.h's contracts.
 */
int mloop_file_store_trim (struct mloop_store *store, uint64_t offset,
                           uint64_t count, unsigned flags);
int mloop_file_store_zero (struct mloop_store *store, uint64_t offset,
                           uint64_t count, unsigned flags);
int mloop_file_store_extents (struct mloop_store *store, uint64_t offset,
                              uint64_t count, bool req_one,
                              mloop_extent_fn fn, void *opaque);

#endif /* MLOOP_FILE_STORE_H */
