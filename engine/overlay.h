/* mloop — a copy-on-write overlay over a read-only base image.
 *
 * The overlay is one file: a header, a map with one bit per cluster
 * (4 KiB) saying "this cluster's bytes are in the overlay", and a sparse
 * data area the size of the base where cluster N lives at
 * data_offset + N * cluster.  Writes go to the data area and set bits;
 * reads of clusters whose bit is clear come from the base, which is
 * opened read-only and may be shared by any number of overlays.  See
 * design.md, "Copy-on-write overlays", for the format and why a crash
 * loses nothing that was flushed.
 *
 * Durability: when a write that fills clusters completes, the file is
 * synced if any of them is new to the overlay (so no bit can reach the
 * disk before its cluster's data), then their bits are written to the
 * file (the page cache) before it is answered, so a server that dies
 * (SIGKILL, the OOM killer) loses no answered write.  A bit shows in
 * memory only once its word is in the file, so a second writer to the
 * cluster, which goes by the memory's map, cannot be answered before
 * the word it depends on is there.
 * A commit (FLUSH) is one fdatasync of the file, data area and map
 * together, so a power cut loses nothing flushed.  A FUA write is
 * durable by its own range only while every map word written so far is
 * durable too (mloop_overlay_map_durable); otherwise it is followed by
 * a commit.  Once a sync of the file has failed, every later commit
 * fails until the overlay is opened again: the kernel reports a failed
 * writeback once and then holds the lost pages as clean (so the whole
 * map is written again at that error, for a later sync to make durable).
 * Bits are only ever set, never cleared, so a torn map page holds old
 * bits or new ones.
 *
 * The engine calls this layer from its few entry points (engine.c,
 * space.c) and nowhere else; front ends never see it.
 */
#ifndef MLOOP_OVERLAY_H
#define MLOOP_OVERLAY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "backing.h"
#include "space.h"

/* The unit of copy-on-write: a write to part of a cluster not yet in the
 * overlay first copies the rest of it up from the base.
 */
#define MLOOP_OVERLAY_CLUSTER 4096u

struct mloop_overlay {
  char *path;
  char *base_path;              /* as recorded in its header */
  int fd;                       /* O_DIRECT when the base's is */
  int map_fd;                   /* buffered: the map's words */
  /* Opened only to sync the file, never written through.  The kernel
   * reports a failed writeback once to each open file, and more than a
   * sync takes that report: a FUA write's RWF_DSYNC, and on NFS a plain
   * write that follows a lost one (ENOSPC, EDQUOT).  Taken by either on
   * fd or map_fd, it is still this descriptor's, for the next commit.
   */
  int sync_fd;
  bool direct;
  uint64_t size;                /* the virtual size: the base's window */
  uint64_t clusters;
  uint64_t map_offset;          /* file offsets of the map and data area */
  uint64_t map_bytes;
  uint64_t data_offset;
  /* The map in memory: one bit per cluster, read and set with atomics
   * from any IO thread; each change goes to the file at once.
   */
  uint64_t *map;
  pthread_mutex_t map_lock;     /* orders the file's copy of a word */
  /* Map words written to the file, and how many of them a completed
   * sync of the file covered; both only grow, read with atomics.
   */
  uint64_t map_written;
  uint64_t map_synced;
  /* One sync of the file at a time, shared by every caller that came
   * while the one before ran (overlay.c, sync_file): two at once wait
   * on the same writeback, and the kernel tells only one of them that
   * it failed.  Generations started and done, the last that failed and
   * its error; all under sync_lock.
   */
  pthread_mutex_t sync_lock;
  pthread_cond_t sync_finished;
  bool syncing;
  uint64_t syncs_started;
  uint64_t syncs_done;
  uint64_t last_failed_sync;
  int last_sync_error;
  /* The first error a sync of the file reported (negative errno), or 0.
   * Also marked in the header (OVERLAY_FLAG_SYNC_FAILED, overlay.c), so
   * that a server started after this one, a restart of the device's
   * server included, fails every FLUSH and FUA write too: the kernel
   * reports the failure to no later opener once one has taken it.
   * Kept until mloop_overlay_clear_sync_failed.
   */
  int sync_error;
  /* Unit tests only (NULL otherwise): called under map_lock just before
   * map word WORD goes to the file, to look into that window.
   */
  void (*before_map_write) (struct mloop_overlay *ov, uint64_t word);
};

/* How mloop_overlay_open takes a base other than the one recorded.
 * The base is the same image when the CRC-32s of its first and last MiB
 * match the recorded ones (design.md, "The format"), and the recorded
 * file itself was not written since (its modification time).
 */
enum mloop_overlay_base_check {
  /* Refuse any other image; the same one under another name (copied,
   * moved) is recorded as the base from now on, but not while the
   * header carries a merge's mark: a half-merged base moved to another
   * filesystem is such a copy, and recorded without the mark it would
   * let discard remove the overlay it needs.
   */
  MLOOP_OVERLAY_SAME_BASE,
  /* As SAME_BASE, and also accept the recorded file itself, at the same
   * path (overlay.c, recorded_file) and on the recorded device or of a
   * birth both know, with other ends when the header
   * carries the mark a merge writes before its first write into it
   * (mloop_overlay_note_merging): a merge stopped half-way has written
   * them.  Not with a modification time older than the recorded one,
   * which no merge gives (the file rolled back to an older version).
   * Records nothing (the merge records the file it writes, with its
   * mark).  The header is its owner's to write: the merge also
   * checks that owner may write the base.
   */
  MLOOP_OVERLAY_MERGE_BASE,
  /* Take any image of the right size and record it as the base: the
   * user's explicit override.
   */
  MLOOP_OVERLAY_ADOPT_BASE,
  /* Take any image of the right size, recording nothing here: a merge
   * the user told to write that image (recorded with the merge's mark,
   * mloop_overlay_note_merging).
   */
  MLOOP_OVERLAY_MERGE_ANY_BASE,
};

/* Opens the overlay at PATH for BASE (opened already, read-only), making
 * it when there is no file at PATH (never replacing one another server
 * made meanwhile), and locks it; opened again should the path name
 * another file once it is locked (a discard or commit removed it).  DIRECT: O_DIRECT on the overlay, as on the base.  An
 * existing overlay must have been made for a base of the same size and,
 * as CHECK says, for this base.  0, or a negative errno with a one-line
 * reason in ERR.
 */
int mloop_overlay_open (struct mloop_overlay *ov, const char *path,
                        const struct mloop_backing *base, bool direct,
                        enum mloop_overlay_base_check check,
                        char *err, size_t errlen);
/* The same for an overlay that must exist already (a merge, an
 * adoption, a restarted server of a device in use): none at PATH, or
 * none once it is locked, is -ENOENT, never a new one.  What PATH
 * names is the caller's to choose and may change meanwhile: one made
 * there would be made wherever a directory swapped for a symlink leads,
 * by whoever runs the command, root as well.  EXPECT, unless NULL, is
 * the file the caller looked at (its stat): any other is refused
 * (-ESTALE) before its header is read, let alone rewritten.  DIRECT as
 * for mloop_overlay_open (a merge goes through the page cache).
 */
int mloop_overlay_open_existing (struct mloop_overlay *ov, const char *path,
                                 const struct stat *expect,
                                 const struct mloop_backing *base,
                                 bool direct,
                                 enum mloop_overlay_base_check check,
                                 char *err, size_t errlen);
void mloop_overlay_close (struct mloop_overlay *ov);

/* Reads the header of the overlay at PATH only: the base it was made
 * for (*BASE_PATH, to free) and its size; *BASE_KNOWN: whether its
 * identity is recorded (else the path is as its server was given it,
 * perhaps relative).  0, or a negative errno with a one-line reason in
 * ERR.
 */
int mloop_overlay_inspect (const char *path, char **base_path,
                           uint64_t *size, bool *base_known, char *err,
                           size_t errlen);
/* The same, of the open file FD (PATH names it in ERR); *MERGING,
 * unless NULL: whether a merge into the recorded base began and did not
 * end, so that the base holds part of the overlay already
 * (mloop_overlay_note_merging).
 */
int mloop_overlay_inspect_fd (int fd, const char *path, char **base_path,
                              uint64_t *size, bool *base_known,
                              bool *merging, char *err, size_t errlen);

/* Copies every cluster the overlay at PATH holds into the image
 * BASE_PATH, whose whole size it must have been made for and which must
 * be its base (ADOPT: any image of that size), then makes the base
 * durable (overlay_merge.c).  The overlay adds nothing to the base any
 * more: REMOVE unlinks it then, while its lock is still held, so no
 * server can take it in between and answer writes into a file about to
 * vanish; without REMOVE it is left.  Either way its mark is cleared
 * first (mloop_overlay_note_merged).
 * BASE_PATH must lead to the base through no symbolic link (realpath's
 * result, or a header's record of one): a link on it is refused.
 * Nothing else may use either meanwhile: the overlay's lock refuses a
 * server on it, and the base is locked exclusively (mloop_lock_image),
 * which every server reading or writing it refuses (they hold it
 * shared), and every QEMU process with it open; a block device is also
 * claimed as the kernel's holders claim it (O_EXCL), so one mounted or
 * under device-mapper is refused, and so is a file a loop device is
 * attached to.  Stopped
 * half-way it can run again: the overlay still reads the same over the
 * base.  0, or a negative errno with a one-line reason in ERR.
 */
int mloop_overlay_merge (const char *path, const char *base_path,
                         bool adopt, bool remove, char *err, size_t errlen);
/* The same, merging only the file CHECKED names (its device and inode)
 * and, with REMOVE, only one that PATH's own entry in its directory
 * names, not a symbolic link: whatever else PATH leads to once opened
 * (a link put there, a directory on it swapped since the caller looked)
 * is refused before anything is written.  CHECKED NULL: any file.
 */
int mloop_overlay_merge_checked (const char *path, const struct stat *checked,
                                 const char *base_path, bool adopt,
                                 bool remove, char *err, size_t errlen);

/* Marks in the header of OV, durably, that a merge is about to write
 * into BASE, recording BASE as the overlay's base first when the header
 * names another file (moved, a copy put in its place, the image of the
 * user's override) or none (version 1, made version 2), or the recorded
 * file as it was before (written since, the user's override) when no
 * merge began in it yet, so that the recorded modification time is the
 * version's the merge begins writing (set to now first when it is later
 * than the clock and the overlay holds clusters, as the merge's first
 * write would set it): a merge stopped
 * half-way may then find that file's ends changed and still run
 * (MLOOP_OVERLAY_MERGE_BASE), and discard refuses the overlay.  0, or a
 * negative errno with ERR.
 */
int mloop_overlay_note_merging (struct mloop_overlay *ov,
                                const struct mloop_backing *base,
                                char *err, size_t errlen);

/* Replaces, durably, the mark mloop_overlay_note_merging set in OV's
 * header with one saying the merge is done, once its base is synced: in
 * a write of its own, changing nothing else.  An overlay left behind
 * (its removal failed) is then refused by every open over a base (a
 * commit, a server, adopt), whatever the base (a block device would not
 * show it was written since), and discard removes it.  Kept, the mark
 * would have discard call it half-merged and a commit resume in a base
 * written since.  0, or a negative errno with ERR.
 */
int mloop_overlay_note_merged (struct mloop_overlay *ov, char *err,
                               size_t errlen);

/* Records the image BASE_PATH, whole, as the base of the overlay at
 * PATH, whatever image it was made for, if it has the size the overlay
 * was made for (overlay_merge.c): the explicit override for an overlay
 * a device will attach.  Refused while a server holds the overlay, and
 * while a commit writes the image (it is read under its shared lock).
 * 0, or a negative errno with a one-line reason in ERR.
 */
int mloop_overlay_adopt (const char *path, const char *base_path,
                         char *err, size_t errlen);
/* The same, of the overlay file CHECKED (a stat the caller took of
 * PATH): if PATH leads to another by the time it is opened, that one
 * is refused before its header is read.
 */
int mloop_overlay_adopt_checked (const char *path,
                                 const struct stat *checked,
                                 const char *base_path, char *err,
                                 size_t errlen);

/* Where the bytes of [offset, offset + count) are. */
enum mloop_overlay_where {
  MLOOP_OVERLAY_IN_BASE,        /* every cluster still in the base */
  MLOOP_OVERLAY_IN_OVERLAY,     /* every cluster in the overlay */
  MLOOP_OVERLAY_MIXED,
};
enum mloop_overlay_where mloop_overlay_where (const struct mloop_overlay *ov,
                                              uint64_t offset,
                                              uint64_t count);

/* Records that the whole clusters of [offset, offset + count) now hold
 * their bytes in the overlay (written, zeroed or trimmed there), in
 * memory and in the file's page cache.  0 or a negative errno (the file
 * refused the map's update: the request must fail).
 */
int mloop_overlay_mark (struct mloop_overlay *ov, uint64_t offset,
                         uint64_t count);

/* Makes every completed write durable, data and map.  Fails with the
 * first sync error the file ever reported, even when this sync succeeds:
 * pages whose writeback failed are lost and the kernel no longer says so.
 */
int mloop_overlay_commit (struct mloop_overlay *ov);

/* The failed-sync check of a server's supervisor, a process that
 * outlives the server: WITNESS is a descriptor of the overlay it opened
 * once the server served, and syncs only here.  The kernel tells a
 * failed writeback to every open file that has not taken it yet, so
 * after a server's exit (killed while a sync that then failed was under
 * way: it took the one report it was given with it) this sync still
 * gets it, and marks the header (flag 8) for the next server, which
 * must not start before.  0, or the sync's negative errno (marked).
 */
int mloop_overlay_witness_sync (int witness);

/* Whether a sync of the overlay failed: under this server, or under
 * one before it (the header's mark).
 */
bool mloop_overlay_sync_failed (const struct mloop_overlay *ov);

/* Forgets the mark a failed sync left in the header of the overlay at
 * PATH (sync_error above): its owner's word that the data on it was
 * checked since.  Only the file CHECKED (its device and inode), the
 * one the caller looked at; refused while a server holds it.  0, or a
 * negative errno with one line in ERR.
 */
int mloop_overlay_clear_sync_failed (const char *path,
                                     const struct stat *checked,
                                     char *err, size_t errlen);

/* Whether every map word written so far is durable and no sync of the
 * file has failed: then a FUA write to clusters already in the overlay
 * is durable once its own range is (RWF_DSYNC).  Otherwise it needs a
 * commit after it.
 */
bool mloop_overlay_map_durable (const struct mloop_overlay *ov);

/* Records ERR (a negative errno) from a write to the overlay's data
 * area: with FUA (RWF_DSYNC) as a failed sync of the file.  No space
 * may be the write's own (a hole it could not fill: nothing else lost)
 * or the report of other pages' failed writeback, which a FUA write's
 * sync takes, and on NFS any write after a lost one: a sync decides,
 * at once, before a crash could take that report with this server.
 */
void mloop_overlay_write_failed (struct mloop_overlay *ov, int err, bool fua);

/* A read or write of any alignment, synchronously: clusters in the base
 * are read from BASE; a write to part of a cluster copies the rest up
 * first, under the range lock LOCK.  FUA: commit after it.  0 or a
 * negative errno.
 */
struct mloop_range_lock;
int mloop_overlay_rw (struct mloop_overlay *ov,
                      const struct mloop_backing *base,
                      struct mloop_range_lock *lock, bool is_write,
                      char *buf, size_t count, uint64_t offset, bool fua);

/* Trim and zero in the overlay (the base is never written): whole
 * clusters become holes of the data area and are marked; partial
 * clusters at either end are zeroed by writing.  A trim is a zero that
 * may punch, as on a plain file.  FLAGS as for mloop_engine_zero.
 */
int mloop_overlay_trim (struct mloop_overlay *ov,
                        const struct mloop_backing *base,
                        struct mloop_range_lock *lock, uint64_t offset,
                        uint64_t count, unsigned flags);
int mloop_overlay_zero (struct mloop_overlay *ov,
                        const struct mloop_backing *base,
                        struct mloop_range_lock *lock, uint64_t offset,
                        uint64_t count, unsigned flags);

/* Allocation as clients see it: the overlay's data area where clusters
 * are marked, the base's allocation elsewhere.
 */
int mloop_overlay_extents (struct mloop_overlay *ov,
                           const struct mloop_backing *base,
                           uint64_t offset, uint64_t count, bool req_one,
                           mloop_extent_fn fn, void *opaque);

#endif /* MLOOP_OVERLAY_H */
