/* mloop — a copy-on-write overlay over a read-only base.  See overlay.h
 * and design.md, "Copy-on-write overlays".
 */
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <zlib.h>

#include "align.h"
#include "fileio.h"
#include "io.h"
#include "overlay.h"
#include "range_lock.h"

/* The header: the first MLOOP_OVERLAY_CLUSTER bytes, little-endian.
 * Version 2 records the base's identity (design.md, "The format");
 * version 1, made before, records its path only and is still read.
 */
static const char overlay_magic[8] = { 'M', 'L', 'O', 'O', 'P', 'C', 'O', 'W' };
#define OVERLAY_VERSION     2u
#define OVERLAY_VERSION_NO_IDENTITY 1u
#define HDR_MAGIC           0
#define HDR_VERSION         8   /* u32 */
#define HDR_CLUSTER         12  /* u32 */
#define HDR_SIZE            16  /* u64: the virtual size */
#define HDR_MAP_OFFSET      24  /* u64 */
#define HDR_MAP_BYTES       32  /* u64 */
#define HDR_DATA_OFFSET     40  /* u64 */
#define HDR_BASE_DEV        48  /* u64: st_dev of the base, version 2 */
#define HDR_BASE_INO        56  /* u64: st_ino of the base, version 2 */
#define HDR_BASE_PATH       64  /* NUL-terminated; absolute in version 2 */
#define HDR_BASE_FIRST_CRC  4064 /* u32: CRC-32 of the base's first MiB */
#define HDR_BASE_LAST_CRC   4068 /* u32: CRC-32 of the base's last MiB */
#define HDR_FLAGS           4072 /* u32, version 2: OVERLAY_FLAG_* */
/* With OVERLAY_FLAG_TIMES: the base's modification time (u64 seconds,
 * u32 nanoseconds) and birth time (u64 seconds, 0 when its filesystem
 * does not tell), when recorded.
 */
#define HDR_BASE_MTIME      4076
#define HDR_BASE_MTIME_NS   4084
#define HDR_BASE_BIRTH      4088
#define HDR_BYTES           MLOOP_OVERLAY_CLUSTER
#define BASE_PATH_MAX       (HDR_BASE_FIRST_CRC - HDR_BASE_PATH - 1)
/* A merge has begun writing into the recorded base: its ends may differ
 * from the fingerprint.  Written and synced before the merge's first
 * write into the base, which is recorded with it when the header named
 * another file; cleared when a server or adopt records another file as
 * the base (kept when the same file is, its ends changed or its name).
 */
#define OVERLAY_FLAG_MERGING 1u
/* The base's times are recorded (HDR_BASE_MTIME): a header made before
 * has none, and gets them when its base is next recorded.
 */
#define OVERLAY_FLAG_TIMES 2u
/* Every cluster was merged into the base and synced: the overlay is
 * spent, left only because its removal failed.  Set in place of the
 * merge's mark.  Opened over a base it is refused (a block device base
 * would not show it was written since: its fingerprint covers only its
 * ends); discard removes it.
 */
#define OVERLAY_FLAG_MERGED 4u
/* A sync of the file failed: writes answered before it may be lost, and
 * every server of the overlay fails FLUSH and FUA writes until its owner
 * clears the mark (overlay.h, sync_error).  Written over the header in
 * place, without another write: its block is the file's first, allocated
 * when the overlay was made, so a full disk beneath takes it (unless it
 * shares that block copy-on-write: btrfs, a reflinked copy).
 */
#define OVERLAY_FLAG_SYNC_FAILED 8u
/* The flags this mloop knows.  Version 2 has no rule for flags an
 * mloop does not know, and one older than OVERLAY_FLAG_MERGED serves a
 * spent overlay; so any other bit, a newer mloop's, is refused when the
 * overlay is opened over a base (read_header).
 */
#define OVERLAY_FLAGS_KNOWN \
  (OVERLAY_FLAG_MERGING | OVERLAY_FLAG_TIMES | OVERLAY_FLAG_MERGED | \
   OVERLAY_FLAG_SYNC_FAILED)
/* How much of each end of the base its fingerprint covers. */
#define FINGERPRINT_SPAN    (1u << 20)
/* The data area starts on a 1 MiB boundary, so its clusters line up with
 * the large pages and extents of the filesystem beneath.
 */
#define DATA_ALIGNMENT      (1u << 20)
#define MAP_PAGE            4096u
#define ZERO_CHUNK          (1u << 20)

static const uint32_t C = MLOOP_OVERLAY_CLUSTER;

static void
put_le64 (unsigned char *p, uint64_t v)
{
  v = htole64 (v);
  memcpy (p, &v, 8);
}

static uint64_t
get_le64 (const unsigned char *p)
{
  uint64_t v;

  memcpy (&v, p, 8);
  return le64toh (v);
}

static void
put_le32 (unsigned char *p, uint32_t v)
{
  v = htole32 (v);
  memcpy (p, &v, 4);
}

static uint32_t
get_le32 (const unsigned char *p)
{
  uint32_t v;

  memcpy (&v, p, 4);
  return le32toh (v);
}

static int
sync_fd (int fd)
{
  return fdatasync (fd) == -1 ? -errno : 0;
}

/* Writes the whole map from memory to the file again.  After a failed
 * writeback the kernel holds the lost map pages as clean: written again
 * they are dirty, so a later sync makes them durable after all.  At a
 * sync error it is best effort (the error is kept whatever this
 * achieves); at open its result counts.
 */
static int
rewrite_map (struct mloop_overlay *ov)
{
  const size_t words = ov->map_bytes / sizeof *ov->map;
  uint64_t *copy = malloc (ov->map_bytes);
  int r;

  if (copy == NULL)
    return -ENOMEM;
  pthread_mutex_lock (&ov->map_lock);
  for (size_t i = 0; i < words; i++)
    copy[i] = htole64 (__atomic_load_n (&ov->map[i], __ATOMIC_ACQUIRE));
  r = mloop_pwrite_all (ov->map_fd, copy, ov->map_bytes, ov->map_offset, 0);
  pthread_mutex_unlock (&ov->map_lock);
  free (copy);
  return r;
}

/* Whether header H has a flags word: version 2's, or version 1's when
 * its path ends before that word (it ran to the header's end), which
 * holds only a failed sync's mark: a version 1 overlay must keep it too
 * until a server records its base.
 */
static bool
has_flags_word (const unsigned char *h)
{
  const uint32_t version = get_le32 (h + HDR_VERSION);

  return version == OVERLAY_VERSION ||
    (version == OVERLAY_VERSION_NO_IDENTITY &&
     memchr (h + HDR_BASE_PATH, 0, HDR_FLAGS - HDR_BASE_PATH) != NULL);
}

/* The refusal of an overlay whose header has no flags word (a version
 * 1 header whose base's path runs into it) to be WHAT (commit, clear):
 * their sync may take a failed writeback's report, which such a header
 * cannot keep.  A server opening it records its base, version 2.
 */
static void
refuse_without_mark_room (const char *path, const char *what, char *err,
                          size_t errlen)
{
  snprintf (err, errlen, "overlay %s has a version 1 header whose base "
            "path leaves no room for a failed sync's mark: attach it once "
            "(its server records its base) before it is %s", path, what);
}

/* Header H's flags (has_flags_word), 0 where it has none. */
static uint32_t
header_flags (const unsigned char *h)
{
  if (!has_flags_word (h))
    return 0;
  return get_le32 (h + HDR_FLAGS) &
    (get_le32 (h + HDR_VERSION) == OVERLAY_VERSION ? ~0u
     : OVERLAY_FLAG_SYNC_FAILED);
}

/* Whether the header of the overlay open on FD has a flags word: 1, 0,
 * or a negative errno.
 */
static int
header_has_flags_word (int fd)
{
  unsigned char *h = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  int r;

  if (h == NULL)
    return -ENOMEM;
  r = mloop_pread_or_zero (fd, h, HDR_BYTES, 0);
  if (r == 0)
    r = has_flags_word (h) ? 1 : 0;
  mloop_free_aligned (h, HDR_BYTES);
  return r;
}

/* Sets FLAG in the header of the overlay open on FD, or clears it
 * (SET false): the flags word alone changes.  A header without one
 * (has_flags_word): -EINVAL.  0 or a negative errno; not synced.
 */
static int
change_header_flag (int fd, uint32_t flag, bool set)
{
  unsigned char *h = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  uint32_t flags;
  int r;

  if (h == NULL)
    return -ENOMEM;
  r = mloop_pread_or_zero (fd, h, HDR_BYTES, 0);
  if (r == 0 && (memcmp (h + HDR_MAGIC, overlay_magic,
                         sizeof overlay_magic) != 0 || !has_flags_word (h)))
    r = -EINVAL;
  if (r == 0) {
    flags = get_le32 (h + HDR_FLAGS);
    if (((flags & flag) != 0) != set) {
      put_le32 (h + HDR_FLAGS, set ? flags | flag : flags & ~flag);
      r = mloop_pwrite_all (fd, h, HDR_BYTES, 0, 0);
    }
  }
  mloop_free_aligned (h, HDR_BYTES);
  return r;
}

/* Marks the header of the overlay open on FD with a failed sync, and
 * syncs it, twice when the first fails: a descriptor that had not taken
 * the kernel's report yet gets it from its first sync, returned before
 * anything is made durable (ext4 and XFS commit no journal, flush no
 * cache, then).  Best effort: the disk that failed may fail this too.
 */
static void
mark_sync_failed (int fd)
{
  if (change_header_flag (fd, OVERLAY_FLAG_SYNC_FAILED, true) == 0 &&
      sync_fd (fd) < 0)
    (void) sync_fd (fd);
}

/* Keeps the first sync error of the file (overlay.h, sync_error), and
 * marks it in the header for the servers after this one.  Best effort:
 * the disk that failed the sync may fail these writes too.
 */
static void
note_sync_error (struct mloop_overlay *ov, int err)
{
  int none = 0;

  if (!__atomic_compare_exchange_n (&ov->sync_error, &none, err, false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  mark_sync_failed (ov->fd);
  /* None yet while the header is read at open. */
  if (ov->map)
    (void) rewrite_map (ov);
}

/* Runs the next generation's fdatasync of the whole file, under
 * sync_lock (let go of while it runs), and records how it went before
 * any caller waiting for it sees it done: one that came later then sees
 * its error too.
 */
static void
run_sync (struct mloop_overlay *ov)
{
  const uint64_t generation = ++ov->syncs_started;
  const uint64_t written = __atomic_load_n (&ov->map_written,
                                            __ATOMIC_ACQUIRE);
  uint64_t synced = __atomic_load_n (&ov->map_synced, __ATOMIC_ACQUIRE);
  int r;

  ov->syncing = true;
  pthread_mutex_unlock (&ov->sync_lock);
  r = sync_fd (ov->sync_fd);
  pthread_mutex_lock (&ov->sync_lock);
  if (r < 0) {
    note_sync_error (ov, r);
    ov->last_failed_sync = generation;
    ov->last_sync_error = r;
  }
  else
    while (synced < written &&
           !__atomic_compare_exchange_n (&ov->map_synced, &synced, written,
                                         false, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
      ;
  ov->syncs_done = generation;
  ov->syncing = false;
  pthread_cond_broadcast (&ov->sync_finished);
}

/* A sync of the whole file, data area and map, that began after this
 * call did: its result (or a later one's failure), an error also kept
 * for every later commit.  On success every map word written before
 * the call is durable.  A caller that comes while a sync runs waits
 * for it and shares the next one with every other that came meanwhile.
 */
static int
sync_file (struct mloop_overlay *ov)
{
  uint64_t target;
  int r;

  pthread_mutex_lock (&ov->sync_lock);
  target = ov->syncs_started + 1;
  while (ov->syncs_done < target) {
    if (ov->syncing)
      pthread_cond_wait (&ov->sync_finished, &ov->sync_lock);
    else
      run_sync (ov);
  }
  r = ov->last_failed_sync >= target ? ov->last_sync_error : 0;
  pthread_mutex_unlock (&ov->sync_lock);
  return r;
}

/* ---- the map ---- */

static bool
cluster_marked (const struct mloop_overlay *ov, uint64_t c)
{
  return (__atomic_load_n (&ov->map[c / 64], __ATOMIC_ACQUIRE)
          >> (c % 64)) & 1;
}

enum mloop_overlay_where
mloop_overlay_where (const struct mloop_overlay *ov, uint64_t offset,
                     uint64_t count)
{
  const uint64_t first = offset / C;
  const uint64_t last = (offset + count - 1) / C;
  bool in_base = false, in_overlay = false;

  for (uint64_t c = first; c <= last; c++) {
    if (cluster_marked (ov, c))
      in_overlay = true;
    else
      in_base = true;
    if (in_base && in_overlay)
      return MLOOP_OVERLAY_MIXED;
  }
  return in_overlay ? MLOOP_OVERLAY_IN_OVERLAY : MLOOP_OVERLAY_IN_BASE;
}

/* Whether marking clusters [first, end) sets a bit not yet set. */
static bool
marks_new (struct mloop_overlay *ov, uint64_t first, uint64_t end)
{
  for (uint64_t c = first; c < end; c++)
    if (!cluster_marked (ov, c))
      return true;
  return false;
}

int
mloop_overlay_mark (struct mloop_overlay *ov, uint64_t offset,
                    uint64_t count)
{
  const uint64_t first = offset / C;
  const uint64_t end = mloop_round_up (offset + count, C) / C;
  int r = 0;

  /* A cluster's first data must be durable before its bit can be: the
   * map's page may reach the disk whenever the kernel writes it back,
   * and a bit there without its data (its blocks not yet allocated in
   * the overlay file when the power went) would make the cluster read
   * as zeroes, neither its old bytes nor its new ones.
   */
  if (marks_new (ov, first, end))
    r = sync_file (ov);
  for (uint64_t c = first; c < end && r == 0; ) {
    const uint64_t word = c / 64;
    const uint64_t upto = end < (word + 1) * 64 ? end : (word + 1) * 64;
    const uint64_t bits = upto - c;
    const uint64_t mask = (bits == 64 ? ~0ull : ((1ull << bits) - 1))
                          << (c % 64);

    if ((__atomic_load_n (&ov->map[word], __ATOMIC_ACQUIRE) & mask) != mask) {
      uint64_t was, now;

      /* Under the lock, so the file's copy of a word two writers change
       * at once ends with both their bits; and the memory's copy changes
       * only once the file's has: a second writer that saw the bits would
       * skip the word and be answered before it was in the file.
       */
      pthread_mutex_lock (&ov->map_lock);
      was = __atomic_load_n (&ov->map[word], __ATOMIC_ACQUIRE);
      now = was | mask;

      if (now != was) {
        const uint64_t le = htole64 (now);

        if (ov->before_map_write)
          ov->before_map_write (ov, word);
        r = mloop_pwrite_all (ov->map_fd, &le, sizeof le,
                              ov->map_offset + word * sizeof le, 0);
        if (r == 0) {
          /* Counted before the bits show: whoever sees them sees the
           * word as one a FUA write may have to wait for.
           */
          __atomic_add_fetch (&ov->map_written, 1, __ATOMIC_ACQ_REL);
          __atomic_store_n (&ov->map[word], now, __ATOMIC_RELEASE);
        }
      }
      pthread_mutex_unlock (&ov->map_lock);
    }
    c = upto;
  }
  return r;
}

int
mloop_overlay_commit (struct mloop_overlay *ov)
{
  int r;

  /* Once a sync failed, the map pages its writeback lost are clean in
   * the page cache: each sync writes the map again first, so the disk
   * gets it once it is well.  (The error is still reported.)
   */
  if (__atomic_load_n (&ov->sync_error, __ATOMIC_ACQUIRE) != 0)
    (void) rewrite_map (ov);
  /* The data area and the map are one file: one fdatasync covers both. */
  r = sync_file (ov);

  return r < 0 ? r : __atomic_load_n (&ov->sync_error, __ATOMIC_ACQUIRE);
}

int
mloop_overlay_witness_sync (int witness)
{
  int r = sync_fd (witness);

  if (r < 0)
    mark_sync_failed (witness);
  return r;
}

bool
mloop_overlay_sync_failed (const struct mloop_overlay *ov)
{
  return __atomic_load_n (&ov->sync_error, __ATOMIC_ACQUIRE) != 0;
}

bool
mloop_overlay_map_durable (const struct mloop_overlay *ov)
{
  return __atomic_load_n (&ov->sync_error, __ATOMIC_ACQUIRE) == 0 &&
    __atomic_load_n (&ov->map_synced, __ATOMIC_ACQUIRE) >=
    __atomic_load_n (&ov->map_written, __ATOMIC_ACQUIRE);
}

void
mloop_overlay_write_failed (struct mloop_overlay *ov, int err, bool fua)
{
  /* The report of other pages' failed writeback was fd's to take;
   * sync_fd has it still, and its sync keeps it, now: left to the next
   * FLUSH, a crash before it would lose it with this server, as no
   * later opener of the file is told.  Blocking, but only out of space,
   * when every write soon is.
   */
  if (err == -ENOSPC || err == -EDQUOT)
    (void) sync_file (ov);
  else if (fua)
    note_sync_error (ov, err);
}
/* ---- data ---- */

/* Reads [offset, offset + count) of the base, virtual coordinates, into
 * BUF (aligned; OFFSET and COUNT whole clusters): the O_DIRECT descriptor
 * before the page-cache tail, the buffered one in it (backing.h), zeroes
 * past the end of the window.
 */
static int
read_base (const struct mloop_backing *base, char *buf, uint64_t count,
           uint64_t offset)
{
  const uint64_t size = mloop_backing_size (base);
  const uint64_t tail = mloop_backing_buffered_from (base);
  uint64_t end = offset + count;
  int r = 0;

  if (end > size) {
    uint64_t from = offset > size ? offset : size;

    memset (buf + (from - offset), 0, end - from);
    end = from;
  }
  while (r == 0 && offset < end) {
    const bool in_tail = offset >= tail;
    const uint64_t upto = in_tail || end <= tail ? end : tail;

    r = mloop_pread_or_zero (in_tail ? base->buffered_fd : base->fd, buf,
                       upto - offset,
                       mloop_backing_file_offset (base, offset));
    buf += upto - offset;
    offset = upto;
  }
  return r;
}

/* Reads whole clusters [start, end) as the device shows them. */
static int
read_clusters (struct mloop_overlay *ov, const struct mloop_backing *base,
               char *buf, uint64_t start, uint64_t end)
{
  int r = 0;

  for (uint64_t pos = start; pos < end && r == 0; ) {
    const bool marked = cluster_marked (ov, pos / C);
    uint64_t run = pos + C;

    while (run < end && cluster_marked (ov, run / C) == marked)
      run += C;
    if (marked)
      r = mloop_pread_or_zero (ov->fd, buf + (pos - start), run - pos,
                         ov->data_offset + pos);
    else
      r = read_base (base, buf + (pos - start), run - pos, pos);
    pos = run;
  }
  return r;
}

/* Writes whole clusters [start, start + count) into the data area and
 * marks them.  (A FUA write's durability is the commit after it: the
 * map's words as well as its data.)
 */
static int
write_clusters (struct mloop_overlay *ov, const char *buf, uint64_t count,
                uint64_t start)
{
  int r = mloop_pwrite_all (ov->fd, buf, count, ov->data_offset + start, 0);

  if (r == 0)
    r = mloop_overlay_mark (ov, start, count);
  return r;
}

int
mloop_overlay_rw (struct mloop_overlay *ov, const struct mloop_backing *base,
                  struct mloop_range_lock *lock, bool is_write, char *buf,
                  size_t count, uint64_t offset, bool fua)
{
  const uint64_t start = mloop_round_down (offset, C);
  const uint64_t end = mloop_round_up (offset + count, C);
  const bool partial = offset != start || offset + count != end;
  struct mloop_range range;
  char *block;
  int r = 0;

  block = mloop_alloc_aligned (end - start, C);
  if (block == NULL)
    return -ENOMEM;
  if (!is_write) {
    r = read_clusters (ov, base, block, start, end);
    if (r == 0)
      memcpy (buf, block + (offset - start), count);
    mloop_free_aligned (block, end - start);
    return r;
  }
  /* A partial cluster's other bytes are copied up under the range lock,
   * so a concurrent write to another part of it is not lost.
   */
  if (partial)
    mloop_range_lock (lock, &range, start, end);
  if (offset != start)
    r = read_clusters (ov, base, block, start, start + C);
  if (r == 0 && offset + count != end && (end - C != start || offset == start))
    r = read_clusters (ov, base, block + (end - C - start), end - C, end);
  if (r == 0) {
    memcpy (block + (offset - start), buf, count);
    r = write_clusters (ov, block, end - start, start);
  }
  if (partial)
    mloop_range_unlock (lock, &range);
  mloop_free_aligned (block, end - start);
  if (r < 0)
    mloop_overlay_write_failed (ov, r, false);
  else if (fua)
    r = mloop_overlay_commit (ov);
  return r;
}

/* ---- space ---- */

/* The whole clusters inside [offset, offset + count); the image's last
 * cluster counts as whole when the range reaches the image's end.
 */
static void
whole_clusters (const struct mloop_overlay *ov, uint64_t offset,
                uint64_t count, uint64_t *start, uint64_t *end)
{
  *start = mloop_round_up (offset, C);
  *end = offset + count == ov->size
    ? mloop_round_up (ov->size, C) : mloop_round_down (offset + count, C);
  if (*end < *start)
    *end = *start;
}

static bool
is_unsupported (int err)
{
  return err == -EOPNOTSUPP || err == -ENOSYS || err == -EINVAL;
}

static int
write_zero_clusters (struct mloop_overlay *ov, uint64_t start, uint64_t end)
{
  const size_t chunk = end - start < ZERO_CHUNK ? end - start : ZERO_CHUNK;
  char *zeroes = mloop_alloc_aligned (chunk, C);
  int r = 0;

  if (zeroes == NULL)
    return -ENOMEM;
  memset (zeroes, 0, chunk);
  for (uint64_t pos = start; pos < end && r == 0; pos += chunk) {
    const uint64_t n = end - pos < chunk ? end - pos : chunk;

    r = write_clusters (ov, zeroes, n, pos);
  }
  mloop_free_aligned (zeroes, chunk);
  return r;
}

/* Zeroes a partial cluster's bytes by writing them. */
static int
zero_bytes (struct mloop_overlay *ov, const struct mloop_backing *base,
            struct mloop_range_lock *lock, uint64_t offset, uint64_t count)
{
  char *zeroes;
  int r;

  if (count == 0)
    return 0;
  zeroes = calloc (1, count);
  if (zeroes == NULL)
    return -ENOMEM;
  r = mloop_overlay_rw (ov, base, lock, true, zeroes, count, offset, false);
  free (zeroes);
  return r;
}

int
mloop_overlay_trim (struct mloop_overlay *ov,
                    const struct mloop_backing *base,
                    struct mloop_range_lock *lock, uint64_t offset,
                    uint64_t count, unsigned flags)
{
  /* As on a plain file, a trim is a zero that may punch, so trimmed
   * bytes read back as zeroes and not as the base's.
   */
  return mloop_overlay_zero (ov, base, lock, offset, count,
                             flags & MLOOP_IO_FUA);
}

int
mloop_overlay_zero (struct mloop_overlay *ov,
                    const struct mloop_backing *base,
                    struct mloop_range_lock *lock, uint64_t offset,
                    uint64_t count, unsigned flags)
{
  const int mode = (flags & MLOOP_ZERO_NO_HOLE)
    ? FALLOC_FL_ZERO_RANGE
    : FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
  uint64_t start, end;
  int r = 0;

  whole_clusters (ov, offset, count, &start, &end);
  if (end > start) {
    r = mloop_fallocate (ov->fd, mode, ov->data_offset + start, end - start);
    if (r == 0)
      r = mloop_overlay_mark (ov, start, end - start);
    else if (is_unsupported (r) && (flags & MLOOP_ZERO_FAST))
      return -ENOTSUP;
    else if (is_unsupported (r))
      r = write_zero_clusters (ov, start, end);
  }
  else
    start = end = offset;
  /* The partial clusters at either end. */
  if (r == 0)
    r = zero_bytes (ov, base, lock, offset, start - offset);
  if (r == 0 && end < offset + count)
    r = zero_bytes (ov, base, lock, end, offset + count - end);
  if (r < 0)
    mloop_overlay_write_failed (ov, r, false);
  else if (flags & MLOOP_IO_FUA)
    r = mloop_overlay_commit (ov);
  return r;
}

int
mloop_overlay_extents (struct mloop_overlay *ov,
                       const struct mloop_backing *base, uint64_t offset,
                       uint64_t count, bool req_one, mloop_extent_fn fn,
                       void *opaque)
{
  const uint64_t end = offset + count;
  int r = 0;

  for (uint64_t pos = offset; pos < end && r == 0; ) {
    const bool marked = cluster_marked (ov, pos / C);
    uint64_t run = mloop_round_down (pos, C) + C;

    while (run < end && cluster_marked (ov, run / C) == marked)
      run += C;
    if (run > end)
      run = end;
    if (marked)
      r = mloop_file_extents (ov->fd, ov->data_offset, false, pos, run,
                              req_one, fn, opaque);
    else
      r = mloop_file_extents (base->fd, base->offset, base->is_block_device,
                              pos, run, req_one, fn, opaque);
    if (req_one)
      break;
    pos = run;
  }
  return r;
}

/* ---- the base's identity ---- */

/* What an overlay records of the base it was made for. */
struct base_identity {
  char path[BASE_PATH_MAX + 1];
  uint64_t dev, ino;
  uint32_t first_crc, last_crc;
  /* The times of a whole regular file, which a header records: a
   * block device node's say nothing of writes to the device, and it is
   * made anew at each boot; the file of a window less than all of it
   * may be written in another window by a device beside this
   * overlay's.
   */
  bool has_times;
  /* A regular file's modification time is known (MTIME, MTIME_NS),
   * whatever the window: compared with the times a header recorded of
   * the whole file, which any window of it written since, or grown
   * since, has changed.
   */
  bool mtime_known;
  /* Seconds, kept as time_t's 64 bits: signed (before 1970,
   * negative); birth 0: not known.
   */
  uint64_t mtime, birth;
  uint32_t mtime_ns;
  /* A block device node: the same node may hold another disk (a loop
   * or NBD device attached again, disks found in another order).
   */
  bool device_node;
};

/* CRC-32 of the window's [offset, offset + count), read in whole
 * clusters (BUF: aligned, at least FINGERPRINT_SPAN + C bytes); zeroes
 * stand for the bytes past the window's end.
 */
static int
crc_of_range (const struct mloop_backing *base, unsigned char *buf,
              uint64_t offset, uint64_t count, uint32_t *crc)
{
  const uint64_t end = mloop_round_up (offset + count, C);
  int r = read_base (base, (char *) buf, end - offset, offset);

  if (r == 0)
    *crc = (uint32_t) crc32 (crc32 (0L, Z_NULL, 0), buf,
                             (uInt) (end - offset));
  return r;
}

/* The base's fingerprint: the CRC-32 of its first and of its last MiB
 * (the window's, when it is one).  Content, not a timestamp: it
 * survives any copy of the image, where cp without -p resets mtime, and
 * it tells apart images of one size, whose partition tables and
 * filesystem superblocks (first MiB) or backup GPT (last MiB) differ.
 */
static int
fingerprint (const struct mloop_backing *base, struct base_identity *id)
{
  const uint64_t size = mloop_backing_size (base);
  const uint64_t span = size < FINGERPRINT_SPAN ? size : FINGERPRINT_SPAN;
  const uint64_t last = mloop_round_down (size - span, C);
  unsigned char *buf = mloop_alloc_aligned (FINGERPRINT_SPAN + C, C);
  int r;

  if (buf == NULL)
    return -ENOMEM;
  r = crc_of_range (base, buf, 0, span, &id->first_crc);
  if (r == 0)
    r = crc_of_range (base, buf, last, size - last, &id->last_crc);
  mloop_free_aligned (buf, FINGERPRINT_SPAN + C);
  return r;
}

/* The birth time of the file open as FD, in seconds, or 0 where its
 * filesystem does not keep one.
 */
static uint64_t
birth_time (int fd)
{
  struct statx stx;

  if (statx (fd, "", AT_EMPTY_PATH, STATX_BTIME, &stx) == 0 &&
      (stx.stx_mask & STATX_BTIME))
    return (uint64_t) stx.stx_btime.tv_sec;
  return 0;
}

/* Whether the canonical path ABS names the base open with the status
 * ST (NAME: the path it was opened by): refused in ERR if not.  The
 * path is resolved after the open, so a link on it (a user's, on the
 * path of the user's image root serves) may lead elsewhere by then:
 * recorded, it would name another file with the base's identity and
 * fingerprint, which a commit, going by that path, would take for a
 * copy of the base and write.
 */
static int
path_names_base (const char *abs, const struct stat *st, const char *name,
                 char *err, size_t errlen)
{
  struct stat named;

  if (stat (abs, &named) == 0 && named.st_dev == st->st_dev &&
      named.st_ino == st->st_ino)
    return 0;
  snprintf (err, errlen, "%s was replaced while being opened (it leads "
            "to %s now)", name, abs);
  return -ESTALE;
}

/* Refuses in ERR a base given as an open descriptor (/proc/self/fd/N)
 * whose link does not lead to it here: the link names the file as its
 * opener saw it, which in another mount namespace (a service's
 * PrivateTmp, a container) may be nothing here or another file.  Told
 * it "was replaced", its user would look for a race that was not.
 */
static int
refuse_unnamed_held (const struct mloop_backing *base, char *err,
                     size_t errlen)
{
  char target[BASE_PATH_MAX + 1];
  ssize_t n = readlink (base->path, target, sizeof target - 1);

  target[n > 0 ? n : 0] = '\0';
  snprintf (err, errlen, "%s: the file open there, named %s by whoever "
            "opened it, is not at that path here (opened in another mount "
            "namespace, such as a service's PrivateTmp, or moved since): an "
            "overlay records its base by a path, so name the image by a path "
            "this server sees", base->path, n > 0 ? target : "(unknown)");
  return -ESTALE;
}

/* BASE's identity: its absolute path, device and inode, fingerprint
 * and times.
 */
static int
identify_base (const struct mloop_backing *base, struct base_identity *id,
               char *err, size_t errlen)
{
  char *abs = realpath (base->path, NULL);
  struct stat st;
  int r;

  memset (id, 0, sizeof *id);
  if (abs == NULL && mloop_backing_named_descriptor (base->path) >= 0)
    return refuse_unnamed_held (base, err, errlen);
  if (abs == NULL) {
    r = -errno;
    snprintf (err, errlen, "%s: %s", base->path, strerror (-r));
    return r;
  }
  /* Recorded whole or refused: a cut path would name another file. */
  if (strlen (abs) > BASE_PATH_MAX) {
    snprintf (err, errlen, "the path of %s is %zu bytes: an overlay's "
              "header records at most %d", base->path, strlen (abs),
              BASE_PATH_MAX);
    free (abs);
    return -ENAMETOOLONG;
  }
  strcpy (id->path, abs);
  free (abs);
  if (fstat (base->fd, &st) == -1) {
    r = -errno;
    snprintf (err, errlen, "%s: %s", base->path, strerror (-r));
    return r;
  }
  if ((r = path_names_base (id->path, &st, base->path, err, errlen)) < 0)
    return mloop_backing_named_descriptor (base->path) >= 0
      ? refuse_unnamed_held (base, err, errlen) : r;
  id->dev = (uint64_t) st.st_dev;
  id->ino = (uint64_t) st.st_ino;
  id->device_node = S_ISBLK (st.st_mode);
  /* A window of all of the file (a --sizelimit as large as it or
   * larger) is the whole file: no other window is left to write.
   */
  if (S_ISREG (st.st_mode)) {
    id->mtime_known = true;
    id->mtime = (uint64_t) st.st_mtim.tv_sec;
    id->mtime_ns = (uint32_t) st.st_mtim.tv_nsec;
  }
  if (S_ISREG (st.st_mode) && base->offset == 0 &&
      mloop_backing_size (base) == (uint64_t) st.st_size) {
    id->has_times = true;
    id->birth = birth_time (base->fd);
  }
  r = fingerprint (base, id);
  if (r < 0)
    snprintf (err, errlen, "cannot read %s: %s", base->path, strerror (-r));
  return r;
}

/* Makes BASE's bytes and times durable before a header records them:
 * else a base just written in place and recorded as it read then could
 * go back to its old bytes at a power cut, its new modification time
 * perhaps journaled already, under an overlay that kept every flushed
 * write, and no check would tell.  A file that cannot be synced (a
 * read-only filesystem) holds nothing unwritten.
 */
static int
sync_base (const struct mloop_backing *base, const char *overlay, char *err,
           size_t errlen)
{
  int r;

  if (fsync (base->fd) == 0 || errno == EINVAL || errno == EROFS)
    return 0;
  r = -errno;
  snprintf (err, errlen, "cannot sync %s before overlay %s records it as "
            "its base: %s", base->path, overlay, strerror (-r));
  return r;
}

/* ---- opening ---- */

static void
encode_identity (unsigned char *h, const struct base_identity *id)
{
  put_le32 (h + HDR_VERSION, OVERLAY_VERSION);
  put_le64 (h + HDR_BASE_DEV, id->dev);
  put_le64 (h + HDR_BASE_INO, id->ino);
  memset (h + HDR_BASE_PATH, 0, HDR_BASE_FIRST_CRC - HDR_BASE_PATH);
  memcpy (h + HDR_BASE_PATH, id->path, strlen (id->path));
  put_le32 (h + HDR_BASE_FIRST_CRC, id->first_crc);
  put_le32 (h + HDR_BASE_LAST_CRC, id->last_crc);
  put_le32 (h + HDR_FLAGS, id->has_times ? OVERLAY_FLAG_TIMES : 0);
  /* Times only of the whole file (has_times): a window's say nothing. */
  put_le64 (h + HDR_BASE_MTIME, id->has_times ? id->mtime : 0);
  put_le32 (h + HDR_BASE_MTIME_NS, id->has_times ? id->mtime_ns : 0);
  put_le64 (h + HDR_BASE_BIRTH, id->birth);
}

static void
encode_header (unsigned char *h, const struct mloop_overlay *ov,
               const struct base_identity *id)
{
  memset (h, 0, HDR_BYTES);
  memcpy (h + HDR_MAGIC, overlay_magic, sizeof overlay_magic);
  put_le32 (h + HDR_CLUSTER, C);
  put_le64 (h + HDR_SIZE, ov->size);
  put_le64 (h + HDR_MAP_OFFSET, ov->map_offset);
  put_le64 (h + HDR_MAP_BYTES, ov->map_bytes);
  put_le64 (h + HDR_DATA_OFFSET, ov->data_offset);
  encode_identity (h, id);
}

/* The layout for a base of SIZE bytes. */
static void
lay_out (struct mloop_overlay *ov, uint64_t size)
{
  ov->size = size;
  ov->clusters = mloop_round_up (size, C) / C;
  ov->map_offset = HDR_BYTES;
  ov->map_bytes = mloop_round_up ((ov->clusters + 7) / 8, MAP_PAGE);
  if (ov->map_bytes == 0)
    ov->map_bytes = MAP_PAGE;
  ov->data_offset = mloop_round_up (ov->map_offset + ov->map_bytes,
                                    DATA_ALIGNMENT);
}

static int
sync_directory_of (const char *path)
{
  char *copy = strdup (path);
  int fd, r = 0;

  if (copy == NULL)
    return -ENOMEM;
  fd = open (dirname (copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd == -1 || fsync (fd) == -1)
    r = -errno;
  if (fd != -1)
    close (fd);
  free (copy);
  return r;
}

/* Puts the finished file TMP at PATH unless a file is there already:
 * then another server made the overlay first and it is theirs, TMP is
 * dropped and 0 returned all the same (the caller opens theirs, whose
 * lock says whether it is free).  Never replaces a file at PATH.
 */
static int
place_new_file (const char *tmp, const char *path)
{
  if (renameat2 (AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
    return 0;
  if (errno == EEXIST) {
    unlink (tmp);
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
    return -errno;
  /* A filesystem without RENAME_NOREPLACE: link() never replaces. */
  if (link (tmp, path) == -1 && errno != EEXIST)
    return -errno;
  unlink (tmp);
  return 0;
}

/* Makes a new overlay at PATH: written whole under a temporary name and
 * put in place, so a crash never leaves half an overlay at PATH, and
 * two servers making it at once end with one overlay, not one each.
 */
static int
create_overlay (const char *path, const struct mloop_backing *base,
                char *err, size_t errlen)
{
  struct mloop_overlay layout;
  struct base_identity id;
  unsigned char header[HDR_BYTES];
  size_t len = strlen (path);
  char *tmp;
  int fd, r;

  r = identify_base (base, &id, err, errlen);
  if (r == 0)
    r = sync_base (base, path, err, errlen);
  if (r < 0)
    return r;
  tmp = malloc (len + sizeof ".new-XXXXXX");
  if (tmp == NULL)
    return -ENOMEM;
  memcpy (tmp, path, len);
  memcpy (tmp + len, ".new-XXXXXX", sizeof ".new-XXXXXX");
  fd = mkostemp (tmp, O_CLOEXEC);
  if (fd == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot create overlay %s: %s", path,
              strerror (-r));
    free (tmp);
    return r;
  }
  memset (&layout, 0, sizeof layout);
  lay_out (&layout, mloop_backing_size (base));
  encode_header (header, &layout, &id);
  r = mloop_pwrite_all (fd, header, sizeof header, 0, 0);
  if (r == 0 && ftruncate (fd, (off_t) (layout.data_offset +
                                        layout.clusters * C)) == -1)
    r = -errno;
  /* The map's blocks now, so that no write's map update can meet a
   * full filesystem later.
   */
  if (r == 0 && fallocate (fd, 0, (off_t) layout.map_offset,
                           (off_t) layout.map_bytes) == -1 &&
      errno != EOPNOTSUPP)
    r = -errno;
  if (r == 0 && fsync (fd) == -1)
    r = -errno;
  close (fd);
  if (r == 0)
    r = place_new_file (tmp, path);
  if (r == 0)
    r = sync_directory_of (path);
  if (r < 0) {
    snprintf (err, errlen, "cannot create overlay %s: %s", path,
              strerror (-r));
    unlink (tmp);
  }
  free (tmp);
  return r;
}

/* Writes header H whole and syncs it. */
static int
write_header (struct mloop_overlay *ov, const unsigned char *h)
{
  int r = mloop_pwrite_all (ov->fd, h, HDR_BYTES, 0, 0);

  return r == 0 ? sync_file (ov) : r;
}

/* Writes header H, version 2, over the version 1 header the file
 * holds, in steps, each synced, that a power cut may tear (a sector,
 * 512 bytes, lands whole or not at all) only into a header read as
 * the version 1 one, flags and all, or as H.  Version 2 keeps its flags
 * word in the last sector, where a version 1 path of 4,008 bytes or
 * more keeps path bytes: written in one go, the first sector (the
 * version) could land without the last, and the path's bytes read as
 * flags, a newer mloop's, which every open refuses; or the last without
 * the first, and a version 1 path cut short or made of two paths, which
 * a commit would write into by its size alone.  So:
 *
 * 1. the version 1 path loses its leading '/' when the later sectors
 *    would change it: a commit asks for --base rather than follow part
 *    of it, a server never followed it (the first sector alone);
 * 2. the last sector: version 1 reads its flags word (a path ending
 *    before it: version 2's always does) for the failed sync's mark,
 *    which it carries;
 * 3. the sectors between, the path's, now read by version 1 only as the
 *    relative path or past its end;
 * 4. the first sector, which makes the header version 2.
 */
static int
upgrade_header (struct mloop_overlay *ov, const unsigned char *h)
{
  const size_t sector = 512, last = HDR_BYTES - sector;
  unsigned char *step = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  size_t end;
  int r;

  if (step == NULL)
    return -ENOMEM;
  if ((r = mloop_pread_or_zero (ov->fd, step, HDR_BYTES, 0)) < 0)
    goto out;
  /* Where the version 1 path ends, its NUL included. */
  end = HDR_BASE_PATH + strnlen ((char *) step + HDR_BASE_PATH,
                                 HDR_BYTES - HDR_BASE_PATH) + 1;
  if (end > HDR_BYTES)
    end = HDR_BYTES;
  if (step[HDR_BASE_PATH] == '/' && end > sector &&
      memcmp (step + sector, h + sector, end - sector) != 0) {
    step[HDR_BASE_PATH] = '?';
    if ((r = write_header (ov, step)) < 0)
      goto out;
  }
  if (memcmp (step + last, h + last, sector) != 0) {
    memcpy (step + last, h + last, sector);
    if ((r = write_header (ov, step)) < 0)
      goto out;
  }
  if (memcmp (step + sector, h + sector, last - sector) != 0) {
    memcpy (step + sector, h + sector, last - sector);
    if ((r = write_header (ov, step)) < 0)
      goto out;
  }
  r = write_header (ov, h);
 out:
  mloop_free_aligned (step, HDR_BYTES);
  return r;
}

/* Records BASE, whose identity is ID, as the overlay's base in header
 * H, and in the file, with the merge's mark when FLAGS has it.
 *
 * A disk writes a sector whole, not the 4 KiB header: a power cut
 * during a rewrite can leave some of its sectors old.  The mark is in
 * the last one, the path, device and inode in the first ones; one write
 * changing both could leave the old file's identity under the new
 * mark's state (a half-merged base recorded without its mark, which
 * discard would then treat as done with).  So the mark changes in a
 * write of its own that changes nothing else, synced: cleared before the
 * other file is recorded, set after.  A torn identity alone is refused
 * as another image, or judged by its ends as a copy is.
 */
static int
record_base (struct mloop_overlay *ov, unsigned char *h,
             const struct mloop_backing *base,
             const struct base_identity *id, uint32_t flags, char *err,
             size_t errlen)
{
  const bool upgrade = get_le32 (h + HDR_VERSION) != OVERLAY_VERSION;
  uint32_t was = header_flags (h);
  uint32_t kept = was & OVERLAY_FLAG_MERGING;
  /* Another base, or this one anew, does not make lost writes found. */
  uint32_t times = (id->has_times ? OVERLAY_FLAG_TIMES : 0) |
    (was & OVERLAY_FLAG_SYNC_FAILED);
  int r;

  if ((r = sync_base (base, ov->path, err, errlen)) < 0)
    return r;
  if (kept && !(flags & OVERLAY_FLAG_MERGING)) {
    kept = 0;
    put_le32 (h + HDR_FLAGS, was & ~OVERLAY_FLAG_MERGING);
    if ((r = write_header (ov, h)) < 0)
      goto out;
  }
  encode_identity (h, id);
  put_le32 (h + HDR_FLAGS, kept | times);
  if ((r = upgrade ? upgrade_header (ov, h) : write_header (ov, h)) < 0)
    goto out;
  if ((flags & OVERLAY_FLAG_MERGING) && !kept) {
    put_le32 (h + HDR_FLAGS, OVERLAY_FLAG_MERGING | times);
    r = write_header (ov, h);
  }
 out:
  if (r < 0)
    snprintf (err, errlen, "cannot record %s as the base of overlay %s: %s",
              id->path, ov->path, strerror (-r));
  return r;
}

/* The base's birth time as header H records it, or 0 when it does not. */
static uint64_t
recorded_birth (const unsigned char *h)
{
  return (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES)
    ? get_le64 (h + HDR_BASE_BIRTH) : 0;
}

/* Whether header H and ID both know their file's birth time, which then
 * tells apart two files of one inode number (a freed number given
 * again, another filesystem's file).
 */
static bool
births_known (const unsigned char *h, const struct base_identity *id)
{
  return recorded_birth (h) != 0 && id->birth != 0;
}

/* Whether header H records ID's file, under whatever name: the same
 * inode, and where both births are known the same birth, wherever it
 * is found; where one is not known, on the same device or at the path
 * the header names (RECORDED).  A device number is not the file's: NFS
 * and btrfs number their mounts as they are made, device-mapper and
 * USB disks theirs as they appear, so after a reboot or a remount the
 * same file may show another, and be mounted at another place (a USB
 * disk's mount point named anew).  Taken for a copy of itself, it would
 * go by its ends alone, be served over a write in its middle and have
 * its new times recorded, and lose a merge's mark.  Another file taken
 * for it (one inode number and birth second alike, or another
 * filesystem at that place without births) is at worst refused as
 * written since, which adopting it overrides; a merge resumes in it
 * only on firmer ground (check_base).
 */
static bool
recorded_file (const unsigned char *h, const char *recorded,
               const struct base_identity *id)
{
  if (get_le32 (h + HDR_VERSION) != OVERLAY_VERSION ||
      get_le64 (h + HDR_BASE_INO) != id->ino)
    return false;
  if (births_known (h, id))
    return recorded_birth (h) == id->birth;
  return get_le64 (h + HDR_BASE_DEV) == id->dev ||
    strcmp (recorded, id->path) == 0;
}

/* Whether header H records ID's file (RECORDED: check_base tells) as
 * written since: with another modification time.  The fingerprint sees
 * only the base's ends, and a partitioned image keeps its filesystems
 * past the first MiB: there, a commit of another overlay over the same
 * base, or any write, changes nothing it sees.  A header records times
 * only of an overlay made over the whole file: opened now as a window
 * of it (the file grown since, a --sizelimit of the old size), the file
 * is still the one it was made over, and was written since all the
 * same.
 */
static bool
written_since (const unsigned char *h, bool recorded,
               const struct base_identity *id)
{
  if (!id->mtime_known || !(get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES) ||
      !recorded)
    return false;
  return get_le64 (h + HDR_BASE_MTIME) != id->mtime ||
    get_le32 (h + HDR_BASE_MTIME_NS) != id->mtime_ns;
}

/* Whether ID's modification time is older than the one header H
 * records.  A merge only moves its base's time forward, so such a file
 * is no file a merge wrote: the recorded file rolled back to an earlier
 * version (a snapshot of its filesystem put back in its place), which
 * keeps its device, inode, birth and path.
 */
static bool
older_than_recorded (const unsigned char *h, const struct base_identity *id)
{
  /* Seconds are signed, as a file keeps them: a time before 1970 is
   * negative, and taken as unsigned it would be later than any other.
   */
  const int64_t sec = (int64_t) get_le64 (h + HDR_BASE_MTIME);
  const int64_t now = (int64_t) id->mtime;

  if (!id->has_times || !(get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES))
    return false;
  return now < sec ||
    (now == sec && id->mtime_ns < get_le32 (h + HDR_BASE_MTIME_NS));
}

/* Whether header H carries a merge's mark and its recorded file is
 * still at the path it records (RECORDED), looked up without following
 * a link: a merge stopped half-way in that file, which holds part of
 * the overlay already.  Found at that path, it is the recorded file by
 * its inode (and birth, where both know it) on whatever device number
 * its filesystem has now: NFS numbers its mounts as they are made and
 * keeps no birth time here, and a remount must not let a copy take the
 * mark from the half-merged file.
 */
static bool
half_merged_in_place (const unsigned char *h, const char *recorded,
                      struct base_identity *there)
{
  struct statx stx;

  if (get_le32 (h + HDR_VERSION) != OVERLAY_VERSION ||
      !(get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING) ||
      statx (AT_FDCWD, recorded, AT_SYMLINK_NOFOLLOW,
             STATX_INO | STATX_BTIME, &stx) != 0)
    return false;
  memset (there, 0, sizeof *there);
  snprintf (there->path, sizeof there->path, "%s", recorded);
  there->dev = (uint64_t) makedev (stx.stx_dev_major, stx.stx_dev_minor);
  there->ino = stx.stx_ino;
  if (stx.stx_mask & STATX_BTIME)
    there->birth = (uint64_t) stx.stx_btime.tv_sec;
  return recorded_file (h, recorded, there);
}

/* Whether header H carries a merge's mark and ID is not the file it
 * records (recorded_file), wherever that file is now.  A server records
 * the image it serves, a copy under another name too, and would record
 * it without the mark: fine for a copy while the half-merged file is
 * elsewhere, but the image may be that file itself, moved to another
 * filesystem (a copy, then an unlink: another inode), its ends the
 * recorded ones when the merge wrote only between them.  Then discard
 * would remove the overlay it still needs.  A commit into it records
 * it with the mark instead (mloop_overlay_note_merging).
 */
static bool
marked_elsewhere (const struct mloop_overlay *ov, const unsigned char *h,
                  const struct base_identity *id)
{
  return get_le32 (h + HDR_VERSION) == OVERLAY_VERSION &&
    (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING) &&
    !recorded_file (h, ov->base_path, id);
}

/* Refuses, in ERR, an image ID other than the file a merge stopped
 * half-way in, while that file is still at its path: recorded in its
 * place (a copy keeping its ends, served or committed), the other image
 * would take the mark, and the half-merged file keep nothing that says
 * so, which discard would then leave so.  Only that very file (its
 * device and inode: under another name, a hard link) is exempt, not
 * one merely taken for it by inode and birth: a snapshot of its
 * filesystem, elsewhere, holds one alike.  THERE is that file
 * (half_merged_in_place), or NULL.  Once that file is gone from
 * its path, a server (CHECK: MLOOP_OVERLAY_SAME_BASE) still refuses any
 * other image (marked_elsewhere), which may be that file moved.
 * Adopting the other image (CHECK) is the owner's word that it is to be
 * the base.
 */
static int
refuse_other_than_half_merged (struct mloop_overlay *ov,
                               const unsigned char *h,
                               const struct base_identity *id,
                               const struct base_identity *there,
                               enum mloop_overlay_base_check check,
                               char *err, size_t errlen)
{
  if (check == MLOOP_OVERLAY_ADOPT_BASE ||
      check == MLOOP_OVERLAY_MERGE_ANY_BASE)
    return 0;
  if (there) {
    if (there->dev == id->dev && there->ino == id->ino)
      return 0;
    snprintf (err, errlen, "overlay %s: a commit into %s stopped half-way, "
              "and %s is another file: finish the commit there (mloop "
              "overlay commit %s), or give %s", ov->path, ov->base_path,
              id->path, ov->path,
              check == MLOOP_OVERLAY_MERGE_BASE
              ? "--adopt-base to move the commit to it on purpose"
              : "--overlay-adopt-base to serve the overlay over it on "
              "purpose, leaving that commit half-way");
    return -EBUSY;
  }
  if (check != MLOOP_OVERLAY_SAME_BASE || !marked_elsewhere (ov, h, id))
    return 0;
  snprintf (err, errlen, "overlay %s: a commit into %s stopped half-way, "
            "and %s is another file (a copy, or that file moved to another "
            "filesystem): finish the commit in it (mloop overlay commit "
            "--base %s %s, with --adopt-base if its first or last MiB "
            "changed), or give --overlay-adopt-base to serve the overlay "
            "over it on purpose", ov->path, ov->base_path, id->path,
            id->path, ov->path);
  return -EBUSY;
}

/* How the owner overrides a refusal of ID's file as OV's base, in the
 * words of CHECK's caller: a commit's option, else the command that
 * adopts it (or a server's --overlay-adopt-base).  An overlay made over
 * all of a file that has grown since (header H recorded the whole
 * file's times, ID is a window of it) cannot be adopted or committed
 * as it is: both open the whole file, of another size.
 */
static void
override_hint (const struct mloop_overlay *ov, const unsigned char *h,
               const struct base_identity *id,
               enum mloop_overlay_base_check check, char *hint, size_t len)
{
  if (!id->has_times && id->mtime_known &&
      (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES))
    snprintf (hint, len, "the overlay was made over all of %s, %" PRIu64
              " bytes, and it has grown since: shrink it back to that size "
              "and run mloop overlay adopt %s %s, or serve it with "
              "--overlay-adopt-base", id->path, ov->size, ov->path,
              id->path);
  else if (check == MLOOP_OVERLAY_MERGE_BASE)
    snprintf (hint, len, "mloop overlay commit --adopt-base overrides this");
  else
    snprintf (hint, len, "mloop overlay adopt %s %s overrides this",
              ov->path, id->path);
}

/* Whether BASE is the base recorded in header H, as CHECK asks; when it
 * is the same image under another name (a copy, a move), or adopted,
 * the header is brought up to date.
 */
static int
check_base (struct mloop_overlay *ov, unsigned char *h,
            const struct mloop_backing *base,
            enum mloop_overlay_base_check check, char *err, size_t errlen)
{
  struct base_identity id, there;
  const uint32_t version = get_le32 (h + HDR_VERSION);
  bool same_content, same_file, in_place, recorded, written, resumed,
    rolled_back;
  int r;

  /* A commit's open syncs, and may take the kernel's report of a
   * failed writeback: it must be able to mark it.  A version 1 header
   * whose path leaves no room for the mark gets it from a server, which
   * records the base (below); a commit records nothing.
   */
  if ((check == MLOOP_OVERLAY_MERGE_BASE ||
       check == MLOOP_OVERLAY_MERGE_ANY_BASE) && !has_flags_word (h)) {
    refuse_without_mark_room (ov->path, "committed", err, errlen);
    return -EINVAL;
  }
  /* No identity recorded: the size was all an older mloop checked, and
   * all that can be checked now; adopting the base records it.
   */
  if (check == MLOOP_OVERLAY_MERGE_ANY_BASE ||
      (version == OVERLAY_VERSION_NO_IDENTITY &&
       check != MLOOP_OVERLAY_ADOPT_BASE &&
       (check != MLOOP_OVERLAY_SAME_BASE || has_flags_word (h))))
    return 0;
  /* One whose path leaves no room for a flags word, for the mark of a
   * failed sync that every server after must find: a server records the
   * base it serves it over, as adopting it would (version 1 took any
   * base of its size).
   */
  if (version == OVERLAY_VERSION_NO_IDENTITY)
    check = MLOOP_OVERLAY_ADOPT_BASE;
  r = identify_base (base, &id, err, errlen);
  if (r < 0)
    return r;
  same_content = version == OVERLAY_VERSION &&
    get_le32 (h + HDR_BASE_FIRST_CRC) == id.first_crc &&
    get_le32 (h + HDR_BASE_LAST_CRC) == id.last_crc;
  in_place = half_merged_in_place (h, ov->base_path, &there);
  /* The very file a merge stopped in, found at the recorded path, is
   * the recorded one under any name (a hard link, a second mount of its
   * filesystem), though by its device (renumbered) and path alone,
   * without births, it is not: taken for a copy, a server would serve
   * it by its ends and record it without the mark, which discard heeds.
   */
  recorded = (in_place && there.dev == id.dev && there.ino == id.ino) ||
    recorded_file (h, ov->base_path, &id);
  same_file = recorded && strcmp (ov->base_path, id.path) == 0;
  written = written_since (h, recorded, &id);
  if ((r = refuse_other_than_half_merged (ov, h, &id,
                                          in_place ? &there : NULL, check,
                                          err, errlen)) < 0)
    return r;
  /* A merge stopped half-way has changed its base's ends already, and
   * said so in the header first.  The header is the overlay owner's to
   * write, mark and all: mloop_overlay_merge also checks that owner may
   * write the base.  The mark lets the merge write that file whatever
   * its ends, so an inode number alike at the path is not enough: another
   * filesystem mounted at that place, keeping no births, may hold
   * another image of that number.  The recorded device too, or a birth
   * both know; else commit --adopt-base says to write it.  Never a
   * block device node: the node is the same file whatever disk it holds
   * now, and the ends are all that tell.
   */
  resumed = same_file && check == MLOOP_OVERLAY_MERGE_BASE &&
    (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING) && !id.device_node &&
    (get_le64 (h + HDR_BASE_DEV) == id.dev || births_known (h, &id));
  /* Nor the file rolled back past the overlay's base: device, inode,
   * birth and path alike, it holds an older image, which the mark would
   * let the merge write as it never writes a base written since.
   */
  rolled_back = resumed && older_than_recorded (h, &id);
  if (rolled_back)
    resumed = false;
  /* Nor adopted under the mark (the same file keeps it, below): its
   * older time recorded, the merge would then resume into any version
   * rolled back to between the two.  Only a merge told to writes it.
   */
  if (check == MLOOP_OVERLAY_ADOPT_BASE && recorded &&
      (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING) &&
      older_than_recorded (h, &id)) {
    snprintf (err, errlen, "overlay %s: a commit into %s stopped half-way, "
              "and its modification time is older than the overlay "
              "recorded: it holds an older version (a snapshot put back?), "
              "not the one the commit wrote; adopting it would keep the "
              "commit's mark on it (`mloop overlay commit --adopt-base` "
              "writes the overlay into it)", ov->path, id.path);
    return -EINVAL;
  }
  if ((!same_content || written) && !resumed &&
      check != MLOOP_OVERLAY_ADOPT_BASE) {
    char hint[2 * PATH_MAX + 64];

    override_hint (ov, h, &id, check, hint, sizeof hint);
    if (rolled_back)
      snprintf (err, errlen, "overlay %s: a commit into %s stopped half-way, "
                "but its modification time is older than the overlay "
                "recorded: it holds an older version than the overlay's base "
                "(a snapshot put back?), not the one the commit wrote "
                "(--adopt-base writes it all the same)", ov->path, id.path);
    else if (same_content)
      snprintf (err, errlen, "overlay %s: its base %s was written since the "
                "overlay was made: its modification time differs (%s)",
                ov->path, id.path, hint);
    else if (same_file && id.device_node &&
             (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING))
      snprintf (err, errlen, "overlay %s: a commit into %s stopped half-way, "
                "and its first or last MiB differ: a device node does not "
                "tell which disk it holds now (--adopt-base writes it if it "
                "is that one)", ov->path, id.path);
    else if (same_file)
      snprintf (err, errlen, "overlay %s: its base %s was written since the "
                "overlay was made: its first or last MiB differ (%s)",
                ov->path, id.path, hint);
    else
      snprintf (err, errlen, "overlay %s was made for %s, not %s: their "
                "first or last MiB differ (%s)", ov->path, ov->base_path,
                id.path, hint);
    return -EINVAL;
  }
  /* A header made before the times were recorded gets them now, one
   * made before a remount the base's device number.
   */
  if (same_file && same_content && !written &&
      get_le64 (h + HDR_BASE_DEV) == id.dev &&
      (!id.has_times || (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES)))
    return 0;
  /* A merge records nothing here: the file it writes is recorded with
   * its mark, once its owner may write it (mloop_overlay_note_merging).
   */
  if (check == MLOOP_OVERLAY_MERGE_BASE)
    return 0;
  /* The same file, adopted (its ends changed), moved or under another
   * device number, is still the base a merge stopped half-way in: its
   * mark stays, which discard heeds.  Another file is no merge's.
   */
  r = record_base (ov, h, base, &id,
                   recorded ? get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING
                   : 0, err, errlen);
  if (r == 0) {
    free (ov->base_path);
    ov->base_path = strdup (id.path);
    if (ov->base_path == NULL)
      r = -ENOMEM;
  }
  return r;
}

/* Whether header H records ID's file as it is now: its ends, and its
 * times where it has them.
 */
static bool
records_as_it_is (const unsigned char *h, const struct base_identity *id)
{
  const bool times = get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_TIMES;

  return get_le32 (h + HDR_BASE_FIRST_CRC) == id->first_crc &&
    get_le32 (h + HDR_BASE_LAST_CRC) == id->last_crc &&
    (!id->has_times ||
     (times && get_le64 (h + HDR_BASE_MTIME) == id->mtime &&
      get_le32 (h + HDR_BASE_MTIME_NS) == id->mtime_ns));
}

/* Whether header H records ID's file at its path and on its device:
 * the file a mark there excuses (check_base).
 */
static bool
same_recorded_file (const struct mloop_overlay *ov, const unsigned char *h,
                    const struct base_identity *id)
{
  return recorded_file (h, ov->base_path, id) &&
    get_le64 (h + HDR_BASE_DEV) == id->dev &&
    strcmp (ov->base_path, id->path) == 0;
}

/* Whether the overlay holds any cluster: a merge writes its base then. */
static bool
holds_clusters (const struct mloop_overlay *ov)
{
  for (uint64_t i = 0; i < ov->map_bytes / sizeof *ov->map; i++)
    if (__atomic_load_n (&ov->map[i], __ATOMIC_ACQUIRE) != 0)
      return true;
  return false;
}

/* Sets BASE's modification time to now when it is later than the clock
 * (unpacked or copied with its times from a machine whose clock ran
 * ahead, `touch -d` a date to come), as the merge's first write is
 * about to: recorded as it was, the time that write gives would be
 * older than the recorded one, and the merge, stopped, would be taken
 * for a rollback of its own base (check_base).  1 when it set it, 0
 * when it had no need, or a negative errno with ERR.
 */
static int
bring_time_to_now (const struct mloop_overlay *ov,
                   const struct mloop_backing *base, char *err,
                   size_t errlen)
{
  struct timespec now;
  struct stat st;
  int r;

  if (fstat (base->fd, &st) == -1 || !S_ISREG (st.st_mode) ||
      clock_gettime (CLOCK_REALTIME, &now) == -1 ||
      st.st_mtim.tv_sec < now.tv_sec ||
      (st.st_mtim.tv_sec == now.tv_sec && st.st_mtim.tv_nsec <= now.tv_nsec))
    return 0;
  /* Both times, as touch does: a write permission's, where the
   * modification time alone (the access time omitted) is only the
   * file's owner's, and the merge is anyone's who may write the base.
   */
  if (futimens (base->fd, NULL) == 0)
    return 1;
  r = -errno;
  snprintf (err, errlen, "%s is dated later than the clock, and its time "
            "could not be set to now before overlay %s is committed into "
            "it: %s", base->path, ov->path, strerror (-r));
  return r;
}

int
mloop_overlay_note_merging (struct mloop_overlay *ov,
                            const struct mloop_backing *base, char *err,
                            size_t errlen)
{
  unsigned char *h = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  struct base_identity id;
  uint32_t version, flags;
  int r;

  if (h == NULL)
    return -ENOMEM;
  r = mloop_pread_or_zero (ov->fd, h, HDR_BYTES, 0);
  if (r < 0) {
    snprintf (err, errlen, "cannot mark overlay %s as being committed: %s",
              ov->path, strerror (-r));
    goto out;
  }
  version = get_le32 (h + HDR_VERSION);
  /* Version 1 kept its path up to the header's end: no flags word. */
  flags = header_flags (h);
  if ((r = identify_base (base, &id, err, errlen)) < 0)
    goto out;
  /* The version the merge begins writing is recorded with the time its
   * writes will not go back from.  Only for a merge beginning in this
   * file: one that stopped in it has written it at the clock's time
   * already, but a mark naming another file (a commit moved to this
   * one) says nothing of this file's time.
   */
  if (!((flags & OVERLAY_FLAG_MERGING) && same_recorded_file (ov, h, &id)) &&
      holds_clusters (ov)) {
    if ((r = bring_time_to_now (ov, base, err, errlen)) < 0)
      goto out;
    if (r == 1 && (r = identify_base (base, &id, err, errlen)) < 0)
      goto out;
  }
  /* The mark excuses the file the header records, by path, device and
   * inode (check_base), so whatever file the merge writes is recorded
   * first: the base under another name (moved) or inode (a copy put in
   * its place), the image a user's override names, the base of a
   * version 1 header, which records no identity.  Else a merge stopped
   * half-way in it could not run again as it began, and discard,
   * finding no mark, would leave that image half-merged.  A copy put in
   * its place may be given the freed inode number again (ext4 does):
   * then only a birth both know tells it apart (recorded_file).
   * The recorded file itself is recorded again as it is now when it was
   * written since (a user's override writes it all the same) and no
   * merge began in it: a stopped merge resumes in it only while its
   * modification time is not older than the recorded one (check_base),
   * which must then be the time of the version the merge began
   * writing, not of the overlay's base, else a snapshot put back of a
   * version between the two passes for the merge's own work.
   */
  if (same_recorded_file (ov, h, &id) &&
      ((flags & OVERLAY_FLAG_MERGING) || records_as_it_is (h, &id))) {
    /* Written and synced even when the header read shows the mark: a
     * commit whose sync of it failed left it perhaps only in the page
     * cache, which the kernel then holds as clean and a later sync does
     * not write.  Written again, it is dirty and the sync counts.
     */
    put_le32 (h + HDR_FLAGS, flags | OVERLAY_FLAG_MERGING);
    r = write_header (ov, h);
    if (r < 0)
      snprintf (err, errlen, "cannot mark overlay %s as being committed: "
                "%s", ov->path, strerror (-r));
    goto out;
  }
  /* A version 1 path ran into the bytes after the flags word. */
  if (version != OVERLAY_VERSION)
    memset (h + HDR_FLAGS, 0, HDR_BYTES - HDR_FLAGS);
  r = record_base (ov, h, base, &id, flags | OVERLAY_FLAG_MERGING, err,
                   errlen);
  if (r == 0) {
    free (ov->base_path);
    ov->base_path = strdup (id.path);
    if (ov->base_path == NULL)
      r = -ENOMEM;
  }
 out:
  mloop_free_aligned (h, HDR_BYTES);
  return r;
}

int
mloop_overlay_note_merged (struct mloop_overlay *ov, char *err,
                           size_t errlen)
{
  unsigned char *h = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  uint32_t flags;
  int r;

  if (h == NULL)
    r = -ENOMEM;
  else
    r = mloop_pread_or_zero (ov->fd, h, HDR_BYTES, 0);
  /* The flags word alone changes: the mark is in the header's last
   * sector, and a write torn by a power cut leaves it set or clear,
   * the identity as it was either way (record_base).
   */
  if (r == 0 && get_le32 (h + HDR_VERSION) == OVERLAY_VERSION &&
      ((flags = get_le32 (h + HDR_FLAGS)) & OVERLAY_FLAG_MERGING)) {
    put_le32 (h + HDR_FLAGS,
              (flags & ~OVERLAY_FLAG_MERGING) | OVERLAY_FLAG_MERGED);
    r = write_header (ov, h);
  }
  if (r < 0)
    snprintf (err, errlen, "cannot mark overlay %s as spent: "
              "%s", ov->path, strerror (-r));
  if (h != NULL)
    mloop_free_aligned (h, HDR_BYTES);
  return r;
}

static int
read_header (struct mloop_overlay *ov, const struct mloop_backing *base,
             enum mloop_overlay_base_check check, bool *base_known,
             bool *merging, char *err, size_t errlen)
{
  unsigned char *h = mloop_alloc_aligned (HDR_BYTES, HDR_BYTES);
  struct mloop_overlay expect;
  uint32_t version;
  struct stat st;
  int r;

  if (h == NULL)
    return -ENOMEM;
  r = mloop_pread_or_zero (ov->fd, h, HDR_BYTES, 0);
  version = get_le32 (h + HDR_VERSION);
  if (r < 0)
    snprintf (err, errlen, "overlay %s: %s", ov->path, strerror (-r));
  else if (memcmp (h + HDR_MAGIC, overlay_magic, sizeof overlay_magic) != 0) {
    snprintf (err, errlen, "%s is not an mloop overlay", ov->path);
    r = -EINVAL;
  }
  else if ((version != OVERLAY_VERSION &&
            version != OVERLAY_VERSION_NO_IDENTITY) ||
           get_le32 (h + HDR_CLUSTER) != C) {
    snprintf (err, errlen, "overlay %s has format version %u (cluster %u), "
              "this mloop reads versions %u and %u (cluster %u)", ov->path,
              version, get_le32 (h + HDR_CLUSTER),
              OVERLAY_VERSION_NO_IDENTITY, OVERLAY_VERSION, C);
    r = -EINVAL;
  }
  if (r < 0)
    goto out;
  if (base_known)
    *base_known = version == OVERLAY_VERSION;
  if (merging)
    *merging = version == OVERLAY_VERSION &&
      (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGING);
  memset (&expect, 0, sizeof expect);
  lay_out (&expect, get_le64 (h + HDR_SIZE));
  /* Version 1 wrote its path up to the header's last byte. */
  ov->base_path = strndup ((char *) h + HDR_BASE_PATH,
                           version == OVERLAY_VERSION ? BASE_PATH_MAX
                           : HDR_BYTES - HDR_BASE_PATH - 1);
  if (ov->base_path == NULL) {
    r = -ENOMEM;
    goto out;
  }
  if (get_le64 (h + HDR_MAP_OFFSET) != expect.map_offset ||
      get_le64 (h + HDR_MAP_BYTES) != expect.map_bytes ||
      get_le64 (h + HDR_DATA_OFFSET) != expect.data_offset) {
    snprintf (err, errlen, "overlay %s: its header is damaged", ov->path);
    r = -EINVAL;
  }
  else if (base && version == OVERLAY_VERSION &&
           (get_le32 (h + HDR_FLAGS) & ~OVERLAY_FLAGS_KNOWN)) {
    snprintf (err, errlen, "overlay %s has flag 0x%x, which this mloop "
              "does not know (a newer mloop's): not opened", ov->path,
              get_le32 (h + HDR_FLAGS) & ~OVERLAY_FLAGS_KNOWN);
    r = -EINVAL;
  }
  else if (base && version == OVERLAY_VERSION &&
           (get_le32 (h + HDR_FLAGS) & OVERLAY_FLAG_MERGED)) {
    snprintf (err, errlen, "overlay %s was committed into its base (%s) "
              "already; remove it: mloop overlay discard %s", ov->path,
              ov->base_path, ov->path);
    r = -EINVAL;
  }
  else if (base && expect.size != mloop_backing_size (base)) {
    snprintf (err, errlen, "overlay %s was made for a base of %llu bytes "
              "(%s); %s is %llu bytes", ov->path,
              (unsigned long long) expect.size, ov->base_path, base->path,
              (unsigned long long) mloop_backing_size (base));
    r = -EINVAL;
  }
  else if (fstat (ov->fd, &st) == -1)
    r = -errno;
  else if ((uint64_t) st.st_size < expect.data_offset +
           expect.clusters * C) {
    snprintf (err, errlen, "overlay %s is truncated (%llu bytes, needs "
              "%llu)", ov->path, (unsigned long long) st.st_size,
              (unsigned long long) (expect.data_offset + expect.clusters * C));
    r = -EINVAL;
  }
  else if (base)
    r = check_base (ov, h, base, check, err, errlen);
  /* A sync failed under an earlier server (OVERLAY_FLAG_SYNC_FAILED):
   * what it lost is lost to this one too.
   */
  if (r == 0 && base && (header_flags (h) & OVERLAY_FLAG_SYNC_FAILED))
    ov->sync_error = -EIO;
  if (r == 0) {
    ov->size = expect.size;
    ov->clusters = expect.clusters;
    ov->map_offset = expect.map_offset;
    ov->map_bytes = expect.map_bytes;
    ov->data_offset = expect.data_offset;
  }
 out:
  mloop_free_aligned (h, HDR_BYTES);
  return r;
}

int
mloop_overlay_inspect_fd (int fd, const char *path, char **base_path,
                          uint64_t *size, bool *base_known, bool *merging,
                          char *err, size_t errlen)
{
  struct mloop_overlay ov;
  struct stat st;
  int r;

  memset (&ov, 0, sizeof ov);
  ov.path = (char *) path;
  ov.fd = fd;
  if (fstat (fd, &st) == -1 || !S_ISREG (st.st_mode)) {
    snprintf (err, errlen, "%s is not an mloop overlay: not a regular file",
              path);
    return -EINVAL;
  }
  r = read_header (&ov, NULL, MLOOP_OVERLAY_SAME_BASE, base_known, merging,
                   err, errlen);
  if (r < 0) {
    free (ov.base_path);
    return r;
  }
  *base_path = ov.base_path;
  *size = ov.size;
  return 0;
}

/* Refuses PATH, before it is opened, when it names a file that is not
 * regular: an overlay never is, and opening is itself an act for a
 * device node (a watchdog starts, a tape rewinds at the close, a
 * terminal may become the opener's) or a FIFO (its peer is released).
 * 0 also when there is no file (the open says so, or makes one).
 */
static int
refuse_special (const char *path, char *err, size_t errlen)
{
  struct stat st;

  if (stat (path, &st) == -1 || S_ISREG (st.st_mode))
    return 0;
  snprintf (err, errlen, "%s is not an mloop overlay: not a regular file",
            path);
  return -EINVAL;
}

int
mloop_overlay_inspect (const char *path, char **base_path, uint64_t *size,
                       bool *base_known, char *err, size_t errlen)
{
  bool special;
  int fd, r;

  if ((r = refuse_special (path, err, errlen)) < 0)
    return r;
  /* Only a regular file, looked up once: what the path names may have
   * changed since (non-blocking and without a controlling terminal all
   * the same).
   */
  fd = mloop_open_regular (AT_FDCWD, path, O_RDONLY | O_CLOEXEC |
                           O_NONBLOCK | O_NOCTTY, &special);
  if (fd == -1 && special) {
    snprintf (err, errlen, "%s is not an mloop overlay: not a regular file",
              path);
    return -EINVAL;
  }
  if (fd == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot open overlay %s: %s", path, strerror (-r));
    return r;
  }
  r = mloop_overlay_inspect_fd (fd, path, base_path, size, base_known, NULL,
                                err, errlen);
  close (fd);
  return r;
}

/* How many times an overlay replaced while being opened is opened again. */
#define OPEN_ATTEMPTS 4

static bool
same_inode (const struct stat *a, const struct stat *b)
{
  return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* Opens the overlay at PATH (made when there is none, if CREATE) and
 * locks it, then its map's and syncs' descriptors: 0, 1 when the
 * path no longer names the locked file (try again), or a negative errno
 * with ERR.  Those are opened by the path too, so they must be the same
 * file: else the map's words would go into another overlay, or its
 * syncs make another durable.  EXPECT, unless NULL, is the file the caller looked at:
 * another is refused.
 */
static int
open_locked (struct mloop_overlay *ov, const char *path,
             const struct stat *expect, const struct mloop_backing *base,
             bool direct, bool create, char *err, size_t errlen)
{
  const int flags = O_RDWR | O_CLOEXEC | O_NOCTTY;
  struct stat held, map, synced, named;
  bool special;
  int r;

  if ((r = refuse_special (path, err, errlen)) < 0)
    return r;
  if (create && access (path, F_OK) == -1 && errno == ENOENT &&
      (r = create_overlay (path, base, err, errlen)) < 0)
    return r;
  ov->direct = direct;
  ov->fd = mloop_open_regular (AT_FDCWD, path,
                               flags | (direct ? O_DIRECT : 0), &special);
  if (ov->fd == -1 && direct && errno == EINVAL && !special) {
    /* A filesystem without O_DIRECT (tmpfs before 6.6): the page cache. */
    ov->direct = false;
    ov->fd = mloop_open_regular (AT_FDCWD, path, flags, &special);
  }
  if (ov->fd == -1 && special) {
    snprintf (err, errlen, "%s is not an mloop overlay: not a regular file",
              path);
    return -EINVAL;
  }
  if (ov->fd == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot open overlay %s: %s", path, strerror (-r));
    return r;
  }
  /* One server per overlay: two would each believe their map. */
  if (flock (ov->fd, LOCK_EX | LOCK_NB) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s is in use by another server", path);
    return r;
  }
  /* Nor an image any store serves (its lock, file_store.c): a plain
   * server writing it, or the base under this very overlay.
   */
  if ((r = mloop_lock_image (ov->fd, true)) < 0) {
    snprintf (err, errlen, "overlay %s is in use by a server as its image",
              path);
    return r;
  }
  /* The map goes through the page cache, a word at a time (see
   * mloop_overlay_mark); the data area never does when O_DIRECT is on,
   * and the two never share a page.
   */
  ov->map_fd = mloop_open_regular (AT_FDCWD, path, flags, &special);
  /* Another file there now (a FIFO as well): the named check below. */
  if (ov->map_fd == -1 && (errno == ENOENT || special))
    return 1;
  if (ov->map_fd == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot open overlay %s: %s", path, strerror (-r));
    return r;
  }
  /* For syncs alone (overlay.h, sync_fd). */
  ov->sync_fd = mloop_open_regular (AT_FDCWD, path, flags, &special);
  if (ov->sync_fd == -1 && (errno == ENOENT || special))
    return 1;
  if (ov->sync_fd == -1) {
    r = -errno;
    snprintf (err, errlen, "cannot open overlay %s: %s", path, strerror (-r));
    return r;
  }
  if (fstat (ov->fd, &held) == -1 || fstat (ov->map_fd, &map) == -1 ||
      fstat (ov->sync_fd, &synced) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
    return r;
  }
  if (!S_ISREG (held.st_mode)) {
    snprintf (err, errlen, "%s is not an mloop overlay: not a regular file",
              path);
    return -EINVAL;
  }
  /* Root runs adopt and commit on users' overlays, in users'
   * directories: by now the name, or a directory on the path, may lead
   * to another overlay (a link put there), whose header adopt would
   * rewrite.  Refused before the header is read.
   */
  if (expect && !same_inode (&held, expect)) {
    snprintf (err, errlen, "overlay %s was replaced since it was looked "
              "at (a link, or a directory on its path, swapped): not "
              "opened", path);
    return -ESTALE;
  }
  if (stat (path, &named) == -1) {
    if (errno == ENOENT)
      return 1;
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
    return r;
  }
  return same_inode (&held, &map) && same_inode (&held, &synced) &&
    same_inode (&held, &named) ? 0 : 1;
}

static int
overlay_open (struct mloop_overlay *ov, const char *path,
              const struct stat *expect, const struct mloop_backing *base,
              bool direct, enum mloop_overlay_base_check check, bool create,
              char *err, size_t errlen)
{
  int r;

  memset (ov, 0, sizeof *ov);
  ov->fd = ov->map_fd = ov->sync_fd = -1;
  ov->path = strdup (path);
  if (ov->path == NULL)
    return -ENOMEM;
  /* Before the header is read: recording a base syncs the file. */
  pthread_mutex_init (&ov->sync_lock, NULL);
  pthread_cond_init (&ov->sync_finished, NULL);
  for (unsigned attempt = 1; ; attempt++) {
    r = open_locked (ov, path, expect, base, direct, create, err, errlen);
    if (r <= 0)
      break;
    /* Removed (a discard or commit, under its lock) and perhaps made
     * anew between the open and the lock: what the path names now.
     */
    if (ov->sync_fd != -1)
      close (ov->sync_fd);
    if (ov->map_fd != -1)
      close (ov->map_fd);
    close (ov->fd);
    ov->fd = ov->map_fd = ov->sync_fd = -1;
    if (attempt == OPEN_ATTEMPTS) {
      snprintf (err, errlen, "overlay %s: removed or replaced each time "
                "it was opened", path);
      r = -EAGAIN;
      break;
    }
  }
  if (r < 0)
    goto fail;
  if ((r = read_header (ov, base, check, NULL, NULL, err, errlen)) < 0)
    goto fail;
  ov->map = calloc (ov->map_bytes / sizeof *ov->map, sizeof *ov->map);
  if (ov->map == NULL) {
    r = -ENOMEM;
    snprintf (err, errlen, "overlay %s: no memory for its map", path);
    goto fail;
  }
  r = mloop_pread_or_zero (ov->map_fd, ov->map, ov->map_bytes, ov->map_offset);
  if (r < 0) {
    snprintf (err, errlen, "cannot read the map of overlay %s: %s", path,
              strerror (-r));
    goto fail;
  }
  for (uint64_t i = 0; i < ov->map_bytes / sizeof *ov->map; i++)
    ov->map[i] = le64toh (ov->map[i]);
  pthread_mutex_init (&ov->map_lock, NULL);
  /* The map as read may be a page cache's copy that never reached the
   * disk: a server before this one saw its writeback fail, and the
   * kernel kept the page as clean.  Written back and synced, what this
   * server serves is what a power cut leaves.
   */
  r = rewrite_map (ov);
  if (r < 0) {
    snprintf (err, errlen, "overlay %s: cannot write its map: %s",
              path, strerror (-r));
    pthread_mutex_destroy (&ov->map_lock);
    goto fail;
  }
  /* A failure here may be the report of writes a server before this one
   * answered and was killed before it synced: no later opener is told,
   * so it is kept and marked (sync_file), and the overlay served all
   * the same, its every FLUSH failing, for the device's client to hear.
   */
  (void) sync_file (ov);
  return 0;

 fail:
  pthread_cond_destroy (&ov->sync_finished);
  pthread_mutex_destroy (&ov->sync_lock);
  free (ov->map);
  if (ov->sync_fd != -1)
    close (ov->sync_fd);
  if (ov->map_fd != -1)
    close (ov->map_fd);
  if (ov->fd != -1)
    close (ov->fd);
  free (ov->base_path);
  free (ov->path);
  memset (ov, 0, sizeof *ov);
  ov->fd = ov->map_fd = ov->sync_fd = -1;
  return r;
}

int
mloop_overlay_open (struct mloop_overlay *ov, const char *path,
                    const struct mloop_backing *base, bool direct,
                    enum mloop_overlay_base_check check,
                    char *err, size_t errlen)
{
  return overlay_open (ov, path, NULL, base, direct, check, true, err,
                       errlen);
}

int
mloop_overlay_open_existing (struct mloop_overlay *ov, const char *path,
                             const struct stat *expect,
                             const struct mloop_backing *base, bool direct,
                             enum mloop_overlay_base_check check,
                             char *err, size_t errlen)
{
  return overlay_open (ov, path, expect, base, direct, check, false, err,
                       errlen);
}

void
mloop_overlay_close (struct mloop_overlay *ov)
{
  if (ov->fd == -1)
    return;
  /* An orderly stop keeps what was written, flushed or not, as the page
   * cache does for a plain image.
   */
  (void) mloop_overlay_commit (ov);
  pthread_mutex_destroy (&ov->map_lock);
  pthread_cond_destroy (&ov->sync_finished);
  pthread_mutex_destroy (&ov->sync_lock);
  free (ov->map);
  close (ov->sync_fd);
  close (ov->map_fd);
  close (ov->fd);
  free (ov->base_path);
  free (ov->path);
  memset (ov, 0, sizeof *ov);
  ov->fd = ov->map_fd = ov->sync_fd = -1;
}

int
mloop_overlay_clear_sync_failed (const char *path, const struct stat *checked,
                                 char *err, size_t errlen)
{
  char *base_path = NULL;
  struct stat held;
  uint64_t size;
  bool special, known, merging;
  int fd, r;

  if ((r = refuse_special (path, err, errlen)) < 0)
    return r;
  fd = mloop_open_regular (AT_FDCWD, path, O_RDWR | O_CLOEXEC | O_NOCTTY,
                           &special);
  if (fd == -1) {
    r = special ? -EINVAL : -errno;
    snprintf (err, errlen, special ? "%s is not an mloop overlay: not a "
              "regular file" : "cannot open overlay %s: %s", path,
              strerror (-r));
    return r;
  }
  /* Root clears users' overlays in their directories: only the file
   * looked at, whatever a link put on the path since leads to.
   */
  if (fstat (fd, &held) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
  }
  else if (!same_inode (&held, checked)) {
    snprintf (err, errlen, "overlay %s was replaced since it was looked "
              "at: not changed", path);
    r = -ESTALE;
  }
  else if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
    r = -errno;
    snprintf (err, errlen, "overlay %s is in use by a server", path);
  }
  else if ((r = mloop_overlay_inspect_fd (fd, path, &base_path, &size,
                                          &known, &merging, err,
                                          errlen)) < 0)
    ;
  else if ((r = header_has_flags_word (fd)) <= 0) {
    if (r == 0) {
      refuse_without_mark_room (path, "cleared", err, errlen);
      r = -EINVAL;
    }
    else
      snprintf (err, errlen, "overlay %s: %s", path, strerror (-r));
  }
  /* A failure no server was told of yet (one killed before its sync)
   * is told to this first sync, the last the kernel tells: kept as the
   * mark, never cleared over.
   */
  else if ((r = sync_fd (fd)) < 0) {
    mark_sync_failed (fd);
    snprintf (err, errlen, "a sync of overlay %s failed just now (%s): "
              "not cleared", path, strerror (-r));
  }
  else if ((r = change_header_flag (fd, OVERLAY_FLAG_SYNC_FAILED,
                                    false)) < 0 || (r = sync_fd (fd)) < 0) {
    mark_sync_failed (fd);
    snprintf (err, errlen, "cannot clear the failed sync's mark of overlay "
              "%s: %s", path, strerror (-r));
  }
  free (base_path);
  close (fd);
  return r;
}
