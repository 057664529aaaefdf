/* mloop — the RBD store: a Ceph RBD image through librbd's asynchronous
 * API (store.h's second kind), built as the module rbd_load.h loads.
 *
 * Names: "rbd:[POOL/[NAMESPACE/]]IMAGE[@SNAP][:id=NAME][:conf=FILE]
 * [:shared=on]", as qemu spells them (POOL defaults to "rbd"; the
 * namespace, to the pool's default one; the options stand in for
 * the configuration's ceph_id, ceph_conf and shared).  A snapshot is
 * served read-only; a read-only open fails once its image or snapshot
 * is removed ("a read-only image removed").  A
 * device's servers serve the image and snapshot its first server opened,
 * by their ids, whatever has the name by then ("which image").
 *
 * The request path: reads, writes and flushes go to rbd_aio_*; librbd
 * completes them on its own threads, where the completion callback posts
 * the request to io->port (port.h), so an event loop gets it through the
 * eventfd it already polls.  A front end that names no port gets the
 * synchronous calls on a thread that may block instead.
 *
 * Durability: the store asks for no librbd cache (rbd_cache=false), as
 * a file is served with O_DIRECT: a write librbd completes is then on
 * the OSDs (an OSD acknowledges a write once it is committed on every
 * replica), so FUA needs nothing more, and FLUSH is rbd_aio_flush, which
 * the cache-less image completes at once.  A pool's or an image's
 * configuration in the cluster beats the client's, so the open image's
 * effective values decide: with the cache on, a FUA write is a write
 * and a flush, and a FUA trim or zero is followed by a flush
 * (read_effective_config).
 *
 * Exclusive use: a writable image is served under librbd's exclusive
 * lock, acquired explicitly (rbd_lock_acquire), which librbd then never
 * hands to another client that asks for it.  Before asking, the store
 * refuses an image another live client holds or has open for writing,
 * naming it, since asking would have that client hand the lock over and
 * fail its next write; a dead holder's lock is broken, the holder
 * blocklisted first whatever the configuration says (break_lock).  A
 * second writer is thus refused at open, unless both chose to share
 * (mloop_engine_config.shared).  Read-only opens take no lock.  A lock
 * librbd loses without our being blocklisted, or believes it still
 * holds when the cluster records another holder, is taken again
 * ("lock lost").
 *
 * A cluster gone: librados waits for it, and so does every request,
 * unless the configuration sets io_timeout (--io-timeout): then a
 * request the cluster has not answered in that time fails with EIO,
 * and the same open image serves again once it answers ("timeouts").
 *
 * Trim is rbd_write_zeroes, which frees whole objects and zeroes the
 * rest, so the range then reads as zeroes, as a trimmed file does,
 * whatever rbd_skip_partial_discard says; zero is
 * rbd_write_zeroes too, which frees whole objects and zeroes the rest
 * sparsely on the OSD, so a fast zero is refused only when the range
 * must stay allocated (thick provisioning writes every byte).  Extents
 * come from the image's allocation (rbd_diff_iterate2 from the start of
 * time, parent included).  Resizes made elsewhere (`rbd resize`) reach
 * the store's size through librbd's update watch.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <rados/librados.h>
#include <rbd/librbd.h>

#include "ceph_conf.h"
#include "engine.h"
#include "rbd_load.h"
#include "rbd_answer.h"
#include "rbd_peers.h"
#include "store.h"
#include "trusted_path.h"

#define DEFAULT_POOL MLOOP_RBD_DEFAULT_POOL

/* How long librados waits for the monitors at start-up before saying
 * so, unless the configuration sets client_mount_timeout (Ceph's
 * default, 300 s, would leave an attach hanging for five minutes on a
 * typo).
 */
#define MOUNT_TIMEOUT "30"
#define CEPH_MOUNT_TIMEOUT 300  /* Ceph's default */

/* The logical block size advertised, as rbd-nbd and krbd do: librbd
 * takes any byte range, so this only guides clients.
 */
#define RBD_BLOCK_SIZE 512

struct rbd_store {
  struct mloop_store base;
  char *name;                   /* "rbd:POOL/IMAGE[@SNAP]", for messages */
  char *pool, *image, *snap;    /* snap: NULL for the image itself */
  char *ns;                     /* the pool's namespace; NULL: the default */
  char *id, *conf;              /* NULL: librados's defaults */
  bool shared;                  /* no exclusive lock */
  rados_t cluster;
  rados_ioctx_t ioctx;
  rbd_image_t rbd;              /* atomic once served: see reopen_flattened */
  uint64_t size;                /* atomic: the update watch changes it */
  bool locked;                  /* atomic: we hold the exclusive lock */
  bool lock_wanted;             /* atomic: one lost is taken again */
  /* What librbd's effective configuration (client, pool and image
   * levels; see read_effective_config) makes of writes.
   */
  bool write_back;              /* rbd_cache: a write may end in memory */
  bool count_walks;             /* MLOOP_TEST_RBD_WALKS: say each walk */
  bool watching;
  uint64_t watch_handle;
  unsigned in_flight;           /* atomic: taken, not yet posted */
  /* Requests the cluster did not answer in time (see "timeouts"):
   * io_timeout in seconds, --io-timeout's, else the configuration's
   * rados_osd_op_timeout; 0: none.
   */
  unsigned io_timeout;
  void (*notice) (const char *line);
  bool silent;                  /* atomic: said so, not yet that it answers */
  pthread_mutex_t silence_lock; /* the rest, and the notices' order */
  pthread_mutex_t regain_lock;  /* one request takes a lost lock again */
  uint64_t regain_refused_ms;   /* monotonic: the last try, refused */
  /* The lock record checked after librbd's watch comes back (see
   * "lock lost"): the checker thread, woken by the update watch.
   */
  char *own_address;            /* how the lock record names us */
  /* The device's earlier servers as the lock record named them when
   * the start took the lock (NULL: none): their watches are no sign of
   * life when the lock is taken again either (regained).
   */
  char *history;
  pthread_t checker;
  bool checker_running;         /* atomic: the update watch reads it */
  pthread_mutex_t check_lock;   /* the two below */
  pthread_cond_t check_wanted;
  bool check_due, check_stop;
  uint64_t last_timeout_ms;     /* monotonic */
  unsigned timed_out;           /* requests failed since it was said */
  bool blocklisted;             /* atomic: said that the cluster refuses us */
  /* A snapshot's id; a read-only open's image id and header object
   * (NULL: not checked), and whether the image or snapshot is gone
   * (atomic; see "a read-only image removed").
   */
  uint64_t snap_id;
  bool snap_id_known;
  char image_id[RBD_MAX_IMAGE_NAME_SIZE];
  char *header_oid;
  uint64_t opened_size;         /* what librbd's read-only open reads */
  /* A read-only open of a clone: its overlap with its parent as librbd
   * opened it, which it never reads again, and the least the header
   * has said since (see follow_shrink).  clone: whether it has one.
   */
  bool clone;
  uint64_t opened_overlap, overlap;
  bool said_overlap;
  /* A flattened clone's first open (reopen_flattened): kept
   * until close, as requests in flight may still use it.
   */
  rbd_image_t stale;
  bool said_reopen_failed;
  bool said_no_overlap_method;  /* parent_overlap_get not known */
  /* That open under way, which the checker waits for without
   * check_lock (reopening, under it); a close meanwhile leaves the
   * checker holding the store (orphaned), which the last of the two
   * holders frees (see finish_orphaned).
   */
  rbd_completion_t reopen_done;
  rbd_image_t reopened;
  bool reopening, orphaned;
  unsigned holders;
  bool gone;
};

static struct rbd_store *
store_of (const struct mloop_store *s)
{
  return (struct rbd_store *) s;
}

/* The open image the requests use (see reopen_flattened). */
static rbd_image_t
image_of (const struct rbd_store *st)
{
  return __atomic_load_n (&st->rbd, __ATOMIC_ACQUIRE);
}

/* ------------------------------------------------------------ requests */

static uint64_t
store_size (const struct mloop_store *s)
{
  return __atomic_load_n (&store_of (s)->size, __ATOMIC_ACQUIRE);
}

/* The range and permission checks every request passes, with the file
 * store's errors: out of range is EINVAL for reads, ENOSPC for writes.
 */
static int
check_request (const struct rbd_store *st, bool is_write, uint64_t offset,
               uint64_t count)
{
  const uint64_t size = store_size (&st->base);

  if (__atomic_load_n (&st->gone, __ATOMIC_ACQUIRE))
    return -EIO;
  if (offset > size || count > size - offset)
    return is_write ? -ENOSPC : -EINVAL;
  if (is_write && !st->base.info.writable)
    return -EPERM;
  return 0;
}

/* ------------------------------------------------------------ timeouts */

/* With io_timeout set, librados fails a request the cluster has not
 * answered in that time with -ETIMEDOUT (rados_osd_op_timeout,
 * rados_mon_op_timeout), and the same open image serves again once the
 * cluster answers.  NBD has no ETIMEDOUT, and a block device's user
 * knows only EIO: the request fails with EIO, and a notice says why.
 *
 * One notice when a request first times out, one when the cluster
 * answers again: when a request succeeds and none has timed out for
 * io_timeout seconds.  A cluster that answers some requests and not
 * others (one OSD of many gone) is not answering again, and two lines
 * at every other request would flood the log.
 */
static void
say (struct rbd_store *st, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

static void
say (struct rbd_store *st, const char *fmt, ...)
{
  char line[512];
  va_list ap;

  if (st->notice == NULL)
    return;
  va_start (ap, fmt);
  vsnprintf (line, sizeof line, fmt, ap);
  va_end (ap);
  st->notice (line);
}

static uint64_t
monotonic_ms (void)
{
  struct timespec now;

  clock_gettime (CLOCK_MONOTONIC, &now);
  return (uint64_t) now.tv_sec * 1000 + (uint64_t) now.tv_nsec / 1000000;
}

static void
note_timeout (struct rbd_store *st)
{
  pthread_mutex_lock (&st->silence_lock);
  st->last_timeout_ms = monotonic_ms ();
  st->timed_out++;
  if (!__atomic_load_n (&st->silent, __ATOMIC_RELAXED)) {
    __atomic_store_n (&st->silent, true, __ATOMIC_RELAXED);
    say (st, "%s: the cluster did not answer in %u s: requests fail with "
         "EIO until it does", st->name, st->io_timeout);
  }
  pthread_mutex_unlock (&st->silence_lock);
}

static void
note_answer (struct rbd_store *st)
{
  pthread_mutex_lock (&st->silence_lock);
  if (__atomic_load_n (&st->silent, __ATOMIC_RELAXED) &&
      monotonic_ms () - st->last_timeout_ms >= st->io_timeout * 1000ull) {
    __atomic_store_n (&st->silent, false, __ATOMIC_RELAXED);
    say (st, "%s: the cluster answers again (%u request%s failed with EIO "
         "meanwhile)", st->name, st->timed_out, st->timed_out == 1 ? "" : "s");
    st->timed_out = 0;
  }
  pthread_mutex_unlock (&st->silence_lock);
}

/* R: what librbd answered a request (a negative errno, or not).
 * Returns it, with a timeout made EIO.
 */
static long
answered (struct rbd_store *st, long r)
{
  if (r == -ETIMEDOUT) {
    note_timeout (st);
    return -EIO;
  }
  /* librbd's EBLOCKLISTED: another client broke our lock and had the
   * cluster refuse us.  Not NBD's ESHUTDOWN (which says the server is
   * going away): every request fails from now on, an IO error.
   */
  if (r == -ESHUTDOWN) {
    if (!__atomic_exchange_n (&st->blocklisted, true, __ATOMIC_RELAXED))
      say (st, "%s: another client broke this server's exclusive lock and "
           "the cluster refuses it (blocklisted): requests fail with EIO",
           st->name);
    return -EIO;
  }
  if (__atomic_load_n (&st->silent, __ATOMIC_RELAXED))
    note_answer (st);
  return r;
}

/* ------------------------------------------------------------ lock lost */

static int refuse_live_peers (struct rbd_store *st, const char *history,
                              char *err, size_t errlen);
static void know_own_lock (struct rbd_store *st);

/* How long after a refused try at taking a lost lock again the next
 * write tries again: each try asks the cluster twice or three times on
 * the thread of the request that makes it.
 */
#define REGAIN_PAUSE_MS 1000

/* librbd can lose the exclusive lock without our being blocklisted:
 * when its watch on the header is re-established after a timeout (the
 * process stopped, the network gone for longer than
 * osd_client_watch_timeout) and the lock was broken meanwhile by a
 * client that did not blocklist us and holds it explicitly.  librbd
 * asks that client for the lock, is refused, and once the other lets
 * it go never asks again: every later write fails with EROFS.  R: what
 * librbd answered a write, trim, zero or flush.  Returns whether the
 * lock was lost and is ours again, so that the request can be made once
 * more.  A live client holding it or having the image open is left
 * alone, and the store says it has lost the lock, the watches of the
 * device's servers the start found recorded not counted, as at the
 * start (a killed one's lingers for osd_client_watch_timeout and would
 * keep the lock out that long); a later write tries
 * again, at most once every REGAIN_PAUSE_MS, so that the lock comes
 * back once that client lets it go, as the store says, whenever the
 * first write after the loss came.  Blocks (librbd's calls): never on a
 * librbd thread.
 */
static bool
regained (struct rbd_store *st, long r)
{
  char err[256];
  int owner = 0;
  bool ok, was_locked;

  if (r != -EROFS || !__atomic_load_n (&st->lock_wanted, __ATOMIC_ACQUIRE))
    return false;
  pthread_mutex_lock (&st->regain_lock);
  was_locked = __atomic_load_n (&st->locked, __ATOMIC_ACQUIRE);
  if (!__atomic_load_n (&st->lock_wanted, __ATOMIC_ACQUIRE))
    ok = false;
  else if (was_locked && rbd_is_exclusive_lock_owner (st->rbd, &owner) == 0
           && owner)
    ok = true;                  /* another request took it again */
  else if (!was_locked &&
           monotonic_ms () - st->regain_refused_ms < REGAIN_PAUSE_MS)
    ok = false;                 /* refused a moment ago */
  else {
    err[0] = '\0';
    ok = refuse_live_peers (st, st->history, err, sizeof err) == 0 &&
      rbd_lock_acquire (st->rbd, RBD_LOCK_MODE_EXCLUSIVE) == 0;
    if (ok) {
      __atomic_store_n (&st->locked, true, __ATOMIC_RELEASE);
      say (st, "%s: librbd lost the exclusive lock: taken again", st->name);
      know_own_lock (st);
    }
    else {
      __atomic_store_n (&st->locked, false, __ATOMIC_RELEASE);
      st->regain_refused_ms = monotonic_ms ();
      /* Once: a write that finds it still taken says nothing new. */
      if (was_locked)
        say (st, "%s: librbd lost the exclusive lock and it cannot be "
             "taken again now%s%s: writes fail until it is free",
             st->name, err[0] ? ": " : "", err);
    }
  }
  pthread_mutex_unlock (&st->regain_lock);
  return ok;
}

/* Whether the cluster's lock record names us: 1, 0 (another client or
 * nobody, said in HOLDER), or a negative errno.
 */
static int
record_names_us (struct rbd_store *st, char *holder, size_t len)
{
  rbd_lock_mode_t mode;
  char *owners[4];
  size_t n = 4, i;
  int r = rbd_lock_get_owners (st->rbd, &mode, owners, &n);

  if (r == -ENOENT) {
    snprintf (holder, len, "no holder");
    return 0;
  }
  if (r < 0)
    return r;
  r = 0;
  snprintf (holder, len, "%s", n > 0 ? owners[0] : "no holder");
  for (i = 0; i < n; i++)
    if (st->own_address && strcmp (owners[i], st->own_address) == 0)
      r = 1;
  rbd_lock_get_owners_cleanup (owners, n);
  return r;
}

/* librbd re-establishes a watch that timed out and then checks that its
 * lock's cookie is still recorded, except when the new watch's handle
 * equals the old one (the allocator gave the same address): then it
 * trusts that a broken lock would have had it blocklisted, which a
 * client breaking it with rbd_blocklist_on_break_lock false does not
 * do.  It then believes it holds a lock the cluster records for another
 * client or for nobody, and writes.  Its watch coming back reaches the
 * update watch, so this compares the record with us then: when it is
 * not ours, librbd's belief is dropped (rbd_lock_release) and the next
 * write, answered EROFS, takes the lock again as regained() does.  So
 * it is when the record cannot be read: librbd may be writing beside
 * its holder, and taking the lock again costs a write a look at who
 * holds it.  (librbd takes a release that cannot reach the cluster for
 * done: the lock can stay recorded as ours, which that write lets go of
 * as its own, let_go_own_record.)
 */
static void
check_lock_record (struct rbd_store *st)
{
  char holder[128];
  int r;

  pthread_mutex_lock (&st->regain_lock);
  if (__atomic_load_n (&st->locked, __ATOMIC_ACQUIRE) &&
      (r = record_names_us (st, holder, sizeof holder)) <= 0) {
    /* Not rbd_is_exclusive_lock_owner first: it asks the cluster too,
     * and says no.  Where librbd holds nothing, this answers EINVAL.
     */
    rbd_lock_release (st->rbd);
    if (r < 0)
      say (st, "%s: whose the exclusive lock is cannot be told (%s): let "
           "go, a write takes it again once it is free", st->name,
           strerror (-r));
    else
      say (st, "%s: the exclusive lock is lost (the cluster records %s): "
           "a write takes it again once it is free", st->name, holder);
  }
  pthread_mutex_unlock (&st->regain_lock);
}

/* Blocks in librbd's synchronous calls, which its own threads must not. */
static void *
lock_checker (void *arg)
{
  struct rbd_store *st = arg;

  pthread_mutex_lock (&st->check_lock);
  for (;;) {
    while (!st->check_due && !st->check_stop)
      pthread_cond_wait (&st->check_wanted, &st->check_lock);
    if (st->check_stop)
      break;
    st->check_due = false;
    pthread_mutex_unlock (&st->check_lock);
    check_lock_record (st);
    pthread_mutex_lock (&st->check_lock);
  }
  pthread_mutex_unlock (&st->check_lock);
  return NULL;
}

static void
want_lock_check (struct rbd_store *st)
{
  pthread_mutex_lock (&st->check_lock);
  st->check_due = true;
  pthread_cond_signal (&st->check_wanted);
  pthread_mutex_unlock (&st->check_lock);
}

/* Stops the checker thread (lock_checker or removal_checker): true when it
 * is left waiting for an open of the image, which holds the store until
 * it ends (see finish_orphaned), and is not waited for.
 */
static bool
stop_lock_checker (struct rbd_store *st)
{
  bool orphaned;

  if (!st->checker_running)
    return false;
  pthread_mutex_lock (&st->check_lock);
  st->check_stop = true;
  orphaned = st->orphaned = st->reopening;
  if (orphaned)
    st->holders = 2;
  pthread_cond_signal (&st->check_wanted);
  pthread_mutex_unlock (&st->check_lock);
  if (orphaned)
    pthread_detach (st->checker);
  else
    pthread_join (st->checker, NULL);
  __atomic_store_n (&st->checker_running, false, __ATOMIC_RELEASE);
  return orphaned;
}

/* One of the two holders of an orphaned store lets go of it: whether it
 * was the last, which frees it.
 */
static bool
let_go (struct rbd_store *st)
{
  bool last;

  pthread_mutex_lock (&st->check_lock);
  last = --st->holders == 0;
  pthread_mutex_unlock (&st->check_lock);
  return last;
}

/* ------------------------------------------- a read-only image removed */

/* A read-only librbd open (a snapshot's, or --read-only) sets no watch
 * on the image's header, so nothing stops `rbd rm` or `rbd snap rm`
 * while it is served, and librbd never learns of either, nor of a
 * resize: a removed snapshot's reads go on at its id, which the OSDs,
 * with no clone left for it, answer from the image as it is now; a
 * removed image's objects are gone, and its reads answer zeroes; so do
 * the reads past the end of an image its writer shrank.  So a thread
 * asks the header every CHECK_MS for the size of what is served
 * (cls_rbd's get_size, which answers ENOENT once the snapshot or the
 * header is gone: one small answer, however many snapshots the image
 * has); the image itself must not be in the trash either (`rbd rm`
 * moves it there first, then removes its objects one by one, the
 * header last; `rbd trash mv` defers the same).  Once one is gone,
 * every request fails with EIO and the store says so; a shrunk image
 * is served at its new size, so that reads past it fail (see
 * follow_shrink).
 */
#define CHECK_MS 2000
#define TRASH_OID "rbd_trash"    /* librbd's RBD_TRASH */
#define HEAD_SNAP_ID ((uint64_t) -2)    /* Ceph's CEPH_NOSNAP: the image */

/* What get_size answers: the object order (8 bits), then the size (64
 * bits, little-endian).
 */
#define SIZE_ANSWER_LEN 9

static uint64_t
le64 (const unsigned char *p)
{
  uint64_t v = 0;

  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

/* Calls cls_rbd's METHOD on object OID with IN, and waits for the
 * answer while the store is not closing: a cluster gone must not hold
 * up a close, so the request is then cancelled (librados completes it
 * at once).  The answer's first OUT_LEN bytes go to OUT.  Not
 * rados_aio_exec: given a buffer, it copies an answer longer than the
 * buffer past its end; a read operation's answer is librados's own.
 * Called with check_lock held.  Returns the answer's whole length, or
 * a negative errno.
 */
static int
ask_cls (struct rbd_store *st, const char *oid, const char *method,
         const char *in, size_t in_len, unsigned char *out, size_t out_len)
{
  const struct timespec tick = { 0, 50 * 1000000L };
  rados_read_op_t op = rados_create_read_op ();
  rados_completion_t c;
  char *answer = NULL;
  size_t answer_len = 0;
  int method_r = 0, r;

  if (op == NULL)
    return -ENOMEM;
  if (rados_aio_create_completion2 (NULL, NULL, &c) < 0) {
    rados_release_read_op (op);
    return -ENOMEM;
  }
  rados_read_op_exec (op, "rbd", method, in, in_len, &answer, &answer_len,
                      &method_r);
  r = rados_aio_read_op_operate (op, st->ioctx, c, oid, 0);
  while (r == 0 && !rados_aio_is_complete (c) && !st->check_stop) {
    pthread_mutex_unlock (&st->check_lock);
    nanosleep (&tick, NULL);
    pthread_mutex_lock (&st->check_lock);
  }
  if (r == 0 && !rados_aio_is_complete (c)) {
    rados_aio_cancel (st->ioctx, c);
    rados_aio_wait_for_complete (c);
  }
  if (r == 0)
    r = rados_aio_get_return_value (c);
  if (r >= 0)
    r = method_r;
  if (r >= 0) {
    if (answer && out_len > 0)
      memcpy (out, answer, answer_len < out_len ? answer_len : out_len);
    r = answer_len > INT_MAX ? -EBADMSG : (int) answer_len;
  }
  rados_aio_release (c);
  rados_release_read_op (op);
  if (answer)
    rados_buffer_free (answer);
  return r;
}

/* The size the header gives what ST serves (its snapshot, or the image
 * itself), in SIZE: 1, 0 when the snapshot or the header is gone, or a
 * negative errno (unknown: the cluster did not answer, or an answer
 * not understood).  get_size takes the snapshot's id as Ceph encodes
 * a 64-bit integer, little-endian.  Called with check_lock held.
 */
static int
size_in_header (struct rbd_store *st, uint64_t *size)
{
  const uint64_t id = st->snap ? st->snap_id : HEAD_SNAP_ID;
  unsigned char answer[SIZE_ANSWER_LEN];
  char in[8];
  int r;

  for (int i = 0; i < 8; i++)
    in[i] = (char) (id >> (8 * i) & 0xff);
  r = ask_cls (st, st->header_oid, "get_size", in, sizeof in, answer,
               sizeof answer);
  if (r == -ENOENT)
    return 0;
  if (r >= 0 && r != SIZE_ANSWER_LEN)
    r = -EBADMSG;
  if (r < 0)
    return r;
  *size = le64 (answer + 1);
  return 1;
}

/* Whether the pool's trash (the object rbd_trash, in ST's namespace)
 * holds the image: 1, 0, or a negative errno.  cls_rbd's trash_get
 * takes the id as Ceph encodes a string: its length (32 bits,
 * little-endian), then its bytes.  Called with check_lock held.
 */
static int
in_trash (struct rbd_store *st)
{
  char in[4 + RBD_MAX_IMAGE_NAME_SIZE];
  const size_t len = strlen (st->image_id);
  int r;

  in[0] = (char) (len & 0xff);
  in[1] = (char) (len >> 8 & 0xff);
  in[2] = (char) (len >> 16 & 0xff);
  in[3] = (char) (len >> 24 & 0xff);
  memcpy (in + 4, st->image_id, len);
  r = ask_cls (st, TRASH_OID, "trash_get", in, 4 + len, NULL, 0);
  return r == -ENOENT ? 0 : r < 0 ? r : 1;
}

/* The overlap of a clone with its parent, as the header says it now
 * (cls_rbd's parent_overlap_get of the image itself, answering an
 * optional 64-bit integer: a byte saying whether there is one, then
 * the integer), in OVERLAP: 1, 0 when the image has no parent now (it
 * was flattened), or a negative errno.  Called with check_lock held.
 */
static int
overlap_in_header (struct rbd_store *st, uint64_t *overlap)
{
  unsigned char answer[SIZE_ANSWER_LEN];
  char in[8];
  int r;

  for (int i = 0; i < 8; i++)
    in[i] = (char) (HEAD_SNAP_ID >> (8 * i) & 0xff);
  r = ask_cls (st, st->header_oid, "parent_overlap_get", in, sizeof in,
               answer, sizeof answer);
  if (r < 0)
    return r;
  if (r == 1 && answer[0] == 0)
    return 0;
  if (r != SIZE_ANSWER_LEN || answer[0] != 1)
    return -EBADMSG;
  *overlap = le64 (answer + 1);
  return 1;
}

/* The image's writer resized it to NOW bytes.  librbd's read-only open
 * still reads up to the size it opened with, and past a shrink it would
 * answer zeroes, or whatever a later growth wrote there, for data that
 * is no longer the image's: the store serves at most NOW bytes, so
 * that a read past them fails (EINVAL, which the kernel gives its
 * reader as EIO) and a supervisor polling the size shrinks the device.
 * Never more than librbd opened: it cannot read past that.  Nor, for a
 * clone, past the least overlap with its parent the header has said: a
 * shrink cuts the overlap (and a growth never gives it back), so the
 * image reads zeroes past it wherever nothing was written since, but
 * librbd's read-only open keeps the overlap it opened with and would
 * read the parent's data there.
 */
static void
follow_shrink (struct rbd_store *st, uint64_t now)
{
  const bool cut = st->clone && st->overlap < st->opened_overlap;
  const uint64_t limit = cut && st->overlap < st->opened_size
    ? st->overlap : st->opened_size;
  const uint64_t served = now < limit ? now : limit;
  const uint64_t was = __atomic_exchange_n (&st->size, served,
                                            __ATOMIC_ACQ_REL);

  if (served < was)
    say (st, "%s: the image was shrunk to %" PRIu64 " bytes: served at "
         "that size, reads past it fail", st->name, served);
  else if (served > was)
    say (st, "%s: the image has %" PRIu64 " bytes again: served at that "
         "size", st->name, served);
  if (now > served && cut && !st->said_overlap) {
    st->said_overlap = true;
    say (st, "%s: the image has %" PRIu64 " bytes, but its overlap with "
         "its parent was cut to %" PRIu64 ", and this read-only open would "
         "read the parent's data past it: served at %" PRIu64 " bytes "
         "until restarted", st->name, now, st->overlap, served);
  }
}

/* The clone was flattened: it has no parent now, but librbd's read-only
 * open keeps the parent it opened with and reads the parent's data
 * wherever the image has no object, as after a discard of a whole
 * object, or a shrink and a growth back.  The image is opened again
 * (by its id, read-only, parent-less now), and the requests use that
 * open from then on; the first stays open until close, for requests
 * in flight on it.  A clone never gains a parent again: once only.
 *
 * The open asks the cluster, which may not answer, and librbd cannot
 * cancel one: so it is asynchronous, waited for as ask_cls waits, and
 * a close meanwhile does not wait for it but leaves the store to this
 * thread (finish_orphaned).  Called with check_lock held; returns with
 * it, the store closing (check_stop) when the open was not done.
 */
static void
reopen_flattened (struct rbd_store *st)
{
  const struct timespec tick = { 0, 50 * 1000000L };
  rbd_image_t fresh = NULL;
  uint64_t size;
  int r;

  /* A close that came while the header was asked (ask_cls lets go of
   * check_lock) found no open under way, and waits to join this
   * thread: none may start now, since only a close that finds one
   * under way leaves it to this thread.  Checked under check_lock,
   * which is held until reopening says one is.
   */
  if (st->check_stop)
    return;
  r = rbd_aio_create_completion (NULL, NULL, &st->reopen_done);
  if (r == 0) {
    st->reopened = NULL;
    r = rbd_aio_open_by_id_read_only (st->ioctx, st->image_id, &st->reopened,
                                      NULL, st->reopen_done);
    if (r < 0)
      rbd_aio_release (st->reopen_done);
  }
  if (r == 0) {
    st->reopening = true;
    while (!rbd_aio_is_complete (st->reopen_done) && !st->check_stop) {
      pthread_mutex_unlock (&st->check_lock);
      nanosleep (&tick, NULL);
      pthread_mutex_lock (&st->check_lock);
    }
    st->reopening = false;
    if (st->orphaned)
      return;
    r = (int) rbd_aio_get_return_value (st->reopen_done);
    rbd_aio_release (st->reopen_done);
    fresh = st->reopened;
  }
  if (r == 0 && (r = rbd_get_size (fresh, &size)) < 0)
    rbd_close (fresh);
  if (r < 0) {
    /* Tried again at the next look. */
    if (!st->said_reopen_failed)
      say (st, "%s: the clone was flattened, and opening it again failed "
           "(%s): it may read its former parent's data where it has "
           "none", st->name, strerror (-r));
    st->said_reopen_failed = true;
    return;
  }
  st->stale = st->rbd;
  __atomic_store_n (&st->rbd, fresh, __ATOMIC_RELEASE);
  st->opened_size = size;
  /* As start_removal_checker: none, unless the header changed again. */
  st->clone = rbd_get_overlap (fresh, &st->opened_overlap) == 0 &&
    st->opened_overlap > 0;
  st->overlap = st->opened_overlap;
  st->said_overlap = false;
  say (st, "%s: the clone was flattened: reopened, to read none of its "
       "former parent's data", st->name);
}

static void release_store (struct rbd_store *st);

/* The store closed while reopen_flattened's open was under way, on the
 * store's ioctx (and so its cluster), and writing st->reopened when it
 * ends: neither may go before it does.  Not in the open's callback,
 * which runs on a librbd thread, where neither rbd_close nor
 * rados_shutdown may be called.  So this thread, which the close no
 * longer waits for, waits for the open, closes what it opened, and the
 * later of it and the close frees the store.  A cluster that never
 * answers keeps the thread, as it keeps librados's own, until the
 * process ends; --io-timeout bounds the wait.
 */
static void
finish_orphaned (struct rbd_store *st)
{
  rbd_aio_wait_for_complete (st->reopen_done);
  if (rbd_aio_get_return_value (st->reopen_done) == 0 && st->reopened)
    rbd_close (st->reopened);
  rbd_aio_release (st->reopen_done);
  if (let_go (st))
    release_store (st);
}

/* Marks the store gone and says WHY, once. */
static void
mark_gone (struct rbd_store *st, const char *why)
{
  __atomic_store_n (&st->gone, true, __ATOMIC_RELEASE);
  say (st, "%s: %s: requests fail with EIO (they would read %s)", st->name,
       why, st->snap ? "the image as it is now" : "zeroes, or what is left");
}

/* One look at the header and the trash: whether to look again (not
 * once the store is gone).  Called with check_lock held.
 */
static bool
check_image (struct rbd_store *st)
{
  uint64_t now;
  const int r = size_in_header (st, &now);

  if (r == 0) {
    mark_gone (st, st->snap ? "the snapshot was removed"
               : "the image was removed");
    return false;
  }
  /* A snapshot's size never changes, nor its overlap. */
  if (r == 1 && st->snap == NULL) {
    uint64_t overlap;
    const int has = st->clone ? overlap_in_header (st, &overlap) : -1;

    /* Not known (below 0): the least said so far holds.  OSDs before
     * Nautilus have no parent_overlap_get (librbd falls back to an
     * older method there): the clone's overlap and flatten are not
     * followed, and the store says so once.
     */
    if (has == -EOPNOTSUPP && !st->said_no_overlap_method) {
      st->said_no_overlap_method = true;
      say (st, "%s: the cluster's OSDs cannot tell a clone's overlap "
           "(parent_overlap_get, Ceph 14): a shrink or a flatten of the "
           "clone is not followed, and it may read its parent's data "
           "where it has none until restarted", st->name);
    }
    if (has == 1 && overlap < st->overlap)
      st->overlap = overlap;
    else if (has == 0 && st->stale == NULL && !st->check_stop) {
      reopen_flattened (st);
      if (st->check_stop)
        return false;
    }
    follow_shrink (st, now);
  }
  /* A snapshot keeps its image from removal: only the header counts. */
  if (st->snap == NULL && !st->check_stop && in_trash (st) == 1) {
    mark_gone (st, "the image was moved to the trash (`rbd rm` does so "
               "first)");
    return false;
  }
  return true;
}

/* Waits for the cluster: a thread of its own. */
static void *
removal_checker (void *arg)
{
  struct rbd_store *st = arg;
  struct timespec until;
  bool orphaned;

  pthread_mutex_lock (&st->check_lock);
  while (!st->check_stop) {
    clock_gettime (CLOCK_MONOTONIC, &until);
    until.tv_sec += CHECK_MS / 1000;
    until.tv_nsec += (CHECK_MS % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    while (!st->check_stop &&
           pthread_cond_timedwait (&st->check_wanted, &st->check_lock,
                                   &until) == 0)
      ;
    if (st->check_stop || !check_image (st))
      break;
  }
  orphaned = st->orphaned;
  pthread_mutex_unlock (&st->check_lock);
  if (orphaned)
    finish_orphaned (st);
  return NULL;
}

/* Starts the check of a read-only open, where the image is of format 2
 * (a format 1 image, long deprecated, is not checked).
 */
static void
start_removal_checker (struct rbd_store *st)
{
  if ((st->snap && !st->snap_id_known) ||
      rbd_get_id (st->rbd, st->image_id, sizeof st->image_id) < 0 ||
      asprintf (&st->header_oid, "rbd_header.%s", st->image_id) < 0) {
    st->header_oid = NULL;
    return;
  }
  st->opened_size = store_size (&st->base);
  /* No overlap: no parent, and a read-only open learns of none later. */
  st->clone = st->snap == NULL &&
    rbd_get_overlap (st->rbd, &st->opened_overlap) == 0 &&
    st->opened_overlap > 0;
  st->overlap = st->opened_overlap;
  if (pthread_create (&st->checker, NULL, removal_checker, st) == 0)
    __atomic_store_n (&st->checker_running, true, __ATOMIC_RELEASE);
}

/* On a librbd thread.  In flight until posted: quiesce waits for that. */
static void
on_rbd_complete (rbd_completion_t c, void *arg)
{
  struct mloop_io *io = arg;
  struct rbd_store *st = store_of (io->taken_by);
  long res = (long) rbd_aio_get_return_value (c);

  rbd_aio_release (c);
  io->port->post (io->port, io, res);
  __atomic_sub_fetch (&st->in_flight, 1, __ATOMIC_RELEASE);
}

static int
store_prepare (struct mloop_store *s, struct mloop_io *io)
{
  struct rbd_store *st = store_of (s);
  rbd_completion_t c;
  int r;

  if (io->op != MLOOP_IO_FLUSH) {
    if (io->count > MLOOP_MAX_REQUEST)
      return -EINVAL;
    r = check_request (st, io->op == MLOOP_IO_WRITE, io->offset, io->count);
    if (r < 0)
      return r;
    if (io->count == 0) {
      io->complete (io, 0);
      return MLOOP_PREPARED_DONE;
    }
  }
  /* A FUA write through librbd's cache is a write and a flush, in
   * order: on a thread that may wait for both.
   */
  if (io->port == NULL || (io->op == MLOOP_IO_WRITE &&
                           (io->flags & MLOOP_IO_FUA) && st->write_back))
    return MLOOP_PREPARED_BLOCKING;
  r = rbd_aio_create_completion (io, on_rbd_complete, &c);
  if (r < 0)
    return r;
  io->taken_by = s;
  __atomic_add_fetch (&st->in_flight, 1, __ATOMIC_RELAXED);
  switch (io->op) {
  case MLOOP_IO_READ:
    r = rbd_aio_read (image_of (st), io->offset, io->count, io->buf, c);
    break;
  case MLOOP_IO_WRITE:
    r = rbd_aio_write (image_of (st), io->offset, io->count, io->buf, c);
    break;
  case MLOOP_IO_FLUSH:
    r = rbd_aio_flush (image_of (st), c);
    break;
  default:
    r = -EINVAL;
  }
  if (r < 0) {
    rbd_aio_release (c);
    __atomic_sub_fetch (&st->in_flight, 1, __ATOMIC_RELAXED);
    return r;
  }
  return MLOOP_PREPARED_QUEUED;
}

/* RES: librbd's return value: a negative errno, or for a read the
 * bytes read; for a write 0 when ASYNC (rbd_aio_write), else the bytes
 * written (rbd_write).  Fewer bytes than asked: the image shrank under
 * the request (rbd_answer.h).
 */
static int
result_error (const struct mloop_io *io, long res, bool async)
{
  return rbd_answer_error (res, io->op == MLOOP_IO_READ || !async,
                           io->count);
}

static int store_perform_blocking (struct mloop_store *s, struct mloop_io *io);

static enum mloop_event_result
store_complete_event (struct mloop_store *s, struct mloop_io *io, long res)
{
  /* Rare, and worth the front end's thread waiting for librbd once. */
  if (regained (store_of (s), res))
    io->complete (io, -store_perform_blocking (s, io));
  else
    io->complete (io, result_error (io, answered (store_of (s), res), true));
  return MLOOP_EVENT_DONE;
}

static int
perform_once (struct rbd_store *st, struct mloop_io *io)
{
  ssize_t n;

  switch (io->op) {
  case MLOOP_IO_READ:
    n = rbd_read (image_of (st), io->offset, io->count, io->buf);
    break;
  case MLOOP_IO_WRITE:
    n = rbd_write (image_of (st), io->offset, io->count, io->buf);
    if (n >= 0 && (io->flags & MLOOP_IO_FUA) && st->write_back) {
      int r = rbd_flush (image_of (st));

      if (r < 0)
        n = r;
    }
    break;
  case MLOOP_IO_FLUSH:
    return (int) answered (st, rbd_flush (image_of (st)));
  default:
    return -EINVAL;
  }
  return -result_error (io, answered (st, (long) n), false);
}

static int
store_perform_blocking (struct mloop_store *s, struct mloop_io *io)
{
  struct rbd_store *st = store_of (s);
  int r = perform_once (st, io);

  return regained (st, r) ? perform_once (st, io) : r;
}

static void
store_complete_blocking (struct mloop_store *s, struct mloop_io *io,
                       int result)
{
  io->complete (io, -result);
}

/* Never prepared for AIO: nothing to perform or give back. */
static long
store_perform_event (struct mloop_store *s, struct mloop_io *io)
{
  return -EINVAL;
}

static void
store_abandon (struct mloop_store *s, struct mloop_io *io)
{
}

static int
store_flush_now (struct mloop_store *s)
{
  struct rbd_store *st = store_of (s);
  int r = rbd_flush (image_of (st));

  if (regained (st, r))
    r = rbd_flush (image_of (st));
  return (int) answered (st, r);
}

/* ------------------------------------------------------------ space */

/* The most one librbd call of the space operations is given: what fits
 * the int or ssize_t each answers in.
 */
#define RBD_STEP ((size_t) 1 << 30)

/* Not rbd_discard: it skips the parts of objects smaller than
 * rbd_discard_granularity_bytes wherever rbd_skip_partial_discard is
 * on, which a pool's or an image's configuration may say, and librbd
 * applies that configuration again at each refresh of the open image
 * (`rbd config image set` while it is served), not only at the open.
 * rbd_write_zeroes without flags is librbd's discard with no
 * granularity: whole objects freed, the rest zeroed, whatever the
 * configuration says now or later.
 */
static ssize_t
trim_step (struct rbd_store *st, uint64_t offset, size_t step)
{
  return rbd_write_zeroes (image_of (st), offset, step, 0, 0);
}

/* A FUA trim or zero: through librbd's cache (the effective
 * configuration's, see the top) a zero that must stay allocated is a
 * write the cache keeps, so it is flushed before it is acknowledged, as
 * a FUA write is.  Without the cache a completed call is on the OSDs.
 */
static int
flush_if_fua (struct rbd_store *st, unsigned flags)
{
  int r;

  if (!(flags & MLOOP_IO_FUA) || !st->write_back)
    return 0;
  r = rbd_flush (image_of (st));
  if (regained (st, r))
    r = rbd_flush (image_of (st));
  return (int) answered (st, r);
}

static int
store_trim (struct mloop_store *s, uint64_t offset, uint64_t count,
            unsigned flags)
{
  struct rbd_store *st = store_of (s);
  int r = check_request (st, true, offset, count);

  if (r == -ENOSPC)
    return -EINVAL;             /* a trim past the end, as for files */
  /* In steps that fit rbd_write_zeroes's size_t and ssize_t (see
   * store_zero); an NBD trim may be up to 4 GiB - 1.
   */
  while (r == 0 && count > 0) {
    size_t step = count > RBD_STEP ? RBD_STEP : (size_t) count;
    /* The bytes discarded, or a negative errno. */
    ssize_t n = trim_step (st, offset, step);

    if (regained (st, n))
      n = trim_step (st, offset, step);
    n = answered (st, n);

    r = -rbd_answer_error (n, true, step);
    offset += step;
    count -= step;
  }
  return r == 0 ? flush_if_fua (st, flags) : r;
}

static int
store_zero (struct mloop_store *s, uint64_t offset, uint64_t count,
            unsigned flags)
{
  struct rbd_store *st = store_of (s);
  int zero_flags = 0;
  ssize_t n;
  int r = check_request (st, true, offset, count);

  if (r < 0 || count == 0)
    return r;
  if (flags & MLOOP_ZERO_NO_HOLE) {
    if (flags & MLOOP_ZERO_FAST)
      return -ENOTSUP;          /* thick provisioning writes every byte */
    zero_flags = RBD_WRITE_ZEROES_FLAG_THICK_PROVISION;
  }
  /* rbd_write_zeroes takes a size_t and answers in an ssize_t: in steps
   * that fit both, whatever the platform.
   */
  while (count > 0) {
    size_t step = count > RBD_STEP ? RBD_STEP : (size_t) count;

    n = rbd_write_zeroes (image_of (st), offset, step, zero_flags, 0);
    if (regained (st, n))
      n = rbd_write_zeroes (image_of (st), offset, step, zero_flags, 0);
    n = answered (st, n);
    if (n != (ssize_t) step)
      return -rbd_answer_error (n, true, step);
    offset += step;
    count -= step;
  }
  return flush_if_fua (st, flags);
}

/* rbd_diff_iterate2 names only the allocated extents, one object at a
 * time: the walk fills the gaps with holes and merges neighbours of one
 * kind, so FN sees the whole range in order, in as few extents as it
 * has.  librbd stops only for a negative answer from its callback
 * (Pacific ignores a positive one and walks on to the end of the
 * range), so a walk that has what it needs answers WALK_STOP.  And it
 * never asks librbd for more than WALK_MOST bytes: a client that asks
 * for one extent at a time (REQ_ONE, as qemu-img does) across a large
 * image would otherwise cost a walk to the end of the image at each
 * request, work that grows with the square of the image's size; the
 * reply covers a prefix of the range, which NBD allows.
 */
#define WALK_MOST ((uint64_t) 1 << 30)
#define WALK_STOP (-ECANCELED)

struct extent_walk {
  uint64_t pos, end;            /* [pos, end): not yet given to FN */
  uint64_t run_end;             /* [pos, run_end): one kind, held back */
  bool run_hole;
  bool req_one;
  mloop_extent_fn fn;
  void *opaque;
  bool done;                    /* REQ_ONE's extent given, or FN failed */
  int error;                    /* FN's, which stopped the walk */
  unsigned long callbacks;      /* librbd's calls, for MLOOP_TEST_RBD_WALKS */
};

/* Gives FN the extent held back, if any. */
static void
walk_flush (struct extent_walk *w)
{
  int r;

  if (w->done || w->run_end <= w->pos)
    return;
  r = w->fn (w->opaque, w->pos, w->run_end - w->pos, w->run_hole);
  w->pos = w->run_end;
  if (r < 0) {
    w->error = r;
    w->done = true;
  }
  else
    w->done = w->req_one;
}

/* The range up to TO is of one kind, HOLE or not. */
static int
walk_add (struct extent_walk *w, uint64_t to, bool hole)
{
  if (to > w->end)
    to = w->end;
  if (w->done || to <= w->run_end)
    return w->done ? WALK_STOP : 0;
  if (w->run_end > w->pos && w->run_hole != hole)
    walk_flush (w);
  if (w->done)
    return WALK_STOP;
  w->run_hole = hole;
  w->run_end = to;
  return 0;
}

static int
on_diff_extent (uint64_t offset, size_t length, int exists, void *arg)
{
  struct extent_walk *w = arg;
  int r;

  w->callbacks++;
  r = walk_add (w, offset, true);
  if (r == 0)
    r = walk_add (w, offset + length, !exists);
  return r;
}

static int
store_extents (struct mloop_store *s, uint64_t offset, uint64_t count,
             bool req_one, mloop_extent_fn fn, void *opaque)
{
  struct rbd_store *st = store_of (s);
  struct extent_walk w = {
    .pos = offset, .run_end = offset, .req_one = req_one,
    .fn = fn, .opaque = opaque,
  };
  int r;

  if (__atomic_load_n (&st->gone, __ATOMIC_ACQUIRE))
    return -EIO;
  if (offset > store_size (s) || count > store_size (s) - offset)
    return -EINVAL;
  if (count > WALK_MOST)
    count = WALK_MOST;
  w.end = offset + count;
  r = (int) answered (st, rbd_diff_iterate2 (image_of (st), NULL, offset,
                                             count, 1, 0, on_diff_extent,
                                             &w));
  if (st->count_walks)
    say (st, "%s: extents of %" PRIu64 "+%" PRIu64 "%s: %lu callbacks",
         st->name, offset, count, req_one ? " (one)" : "", w.callbacks);
  if (w.error)
    return w.error;
  if (r < 0 && !(r == WALK_STOP && w.done))
    return r;
  walk_add (&w, w.end, true);
  walk_flush (&w);
  return w.error;
}

/* ------------------------------------------------------------ size */

static int
read_size (struct rbd_store *st)
{
  uint64_t size;
  int r = rbd_get_size (image_of (st), &size);

  if (r == 0)
    __atomic_store_n (&st->size, size, __ATOMIC_RELEASE);
  return r;
}

static int
store_reprobe_size (struct mloop_store *s, char *err, size_t errlen)
{
  struct rbd_store *st = store_of (s);
  int r;

  /* A read-only open's librbd answers the size it opened with, whatever
   * the image's is now: the removal checker follows the header instead
   * (follow_shrink), and librbd's answer would undo a shrink it saw.
   */
  if (__atomic_load_n (&st->checker_running, __ATOMIC_ACQUIRE) &&
      !s->info.writable)
    return 0;
  r = read_size (st);

  if (r < 0)
    snprintf (err, errlen, "%s: reading the size: %s", st->name,
              strerror (-r));
  return r;
}

/* Resizes the image.  When another client (the device's server) holds
 * the exclusive lock, librbd hands the resize to that holder, which
 * performs it and so serves the new size at once.
 */
static int
store_set_size (struct mloop_store *s, uint64_t size, char *err,
                size_t errlen)
{
  struct rbd_store *st = store_of (s);
  int r;

  if (!s->info.writable) {
    snprintf (err, errlen, "%s: cannot set its size: %s", st->name,
              st->snap ? "a snapshot is read-only" : "opened read-only");
    return -EROFS;
  }
  r = rbd_resize (image_of (st), size);
  if (r == 0)
    r = read_size (st);
  if (r < 0)
    snprintf (err, errlen, "%s: resizing to %" PRIu64 " bytes: %s",
              st->name, size, strerror (-r));
  return r;
}

/* The exclusive-lock feature turned off (`rbd feature disable IMAGE
 * exclusive-lock`, which librbd hands to the holder, us, to perform)
 * while we hold the lock, or want it back: there is no lock any more,
 * and any client may write beside us.  Nothing refuses it, so the store
 * says so once; its description says the lock is lost.  A feature
 * turned on again gives no lock back: librbd would take one on its own
 * at the next write, and hand it to any client that asked.
 */
static void
check_feature_kept (struct rbd_store *st)
{
  uint64_t features;

  if (__atomic_load_n (&st->lock_wanted, __ATOMIC_ACQUIRE) &&
      rbd_get_features (image_of (st), &features) == 0 &&
      !(features & RBD_FEATURE_EXCLUSIVE_LOCK) &&
      __atomic_exchange_n (&st->lock_wanted, false, __ATOMIC_ACQ_REL)) {
    __atomic_store_n (&st->locked, false, __ATOMIC_RELEASE);
    say (st, "%s: its exclusive-lock feature was turned off: other clients "
         "may now write it beside this server (turn it on and restart the "
         "server to be its one writer again)", st->name);
  }
}

/* librbd's update watch: the image's header changed (a resize, a
 * snapshot, a feature), here or elsewhere.  Requests checked after this
 * see the new size.
 */
static void
on_image_update (void *arg)
{
  struct rbd_store *st = arg;

  read_size (st);
  check_feature_kept (st);
  /* Also called once librbd's watch is back after it timed out. */
  if (__atomic_load_n (&st->checker_running, __ATOMIC_ACQUIRE))
    want_lock_check (st);
}

/* ------------------------------------------------------------ open */

static void
store_describe (const struct mloop_store *s, char *buf, size_t len)
{
  const struct rbd_store *st = store_of (s);
  int owner = 0;

  /* librbd's own state: the lock may be lost since the last write. */
  if (__atomic_load_n (&st->locked, __ATOMIC_ACQUIRE) &&
      rbd_is_exclusive_lock_owner (image_of (st), &owner) != 0)
    owner = 0;
  snprintf (buf, len, "%s: %" PRIu64 " bytes, %s%s%s", st->name,
            store_size (s), s->info.writable ? "read-write" : "read-only",
            __atomic_load_n (&st->gone, __ATOMIC_ACQUIRE)
            ? st->snap ? ", snapshot removed" : ", image removed" : "",
            owner ? ", exclusive lock held"
            : st->locked || (s->info.writable && !st->shared)
            ? ", exclusive lock lost" : s->info.writable ? ", shared" : "");
}

static void
store_probe_features (struct mloop_store *s)
{
}

/* Polls: only a front end stopping with requests in flight waits here,
 * once, and librbd gives no way to wait for them all but rbd_close.
 */
static void
store_quiesce (struct mloop_store *s)
{
  const struct timespec tick = { 0, 1000000 };

  while (__atomic_load_n (&store_of (s)->in_flight, __ATOMIC_ACQUIRE))
    nanosleep (&tick, NULL);
}

/* What the store's images use: its cluster's handles, and the store. */
static void
release_store (struct rbd_store *st)
{
  if (st->ioctx)
    rados_ioctx_destroy (st->ioctx);
  if (st->cluster)
    rados_shutdown (st->cluster);
  pthread_mutex_destroy (&st->silence_lock);
  pthread_mutex_destroy (&st->regain_lock);
  pthread_mutex_destroy (&st->check_lock);
  pthread_cond_destroy (&st->check_wanted);
  free (st->own_address);
  free (st->history);
  free (st->header_oid);
  free (st->name);
  free (st->pool);
  free (st->ns);
  free (st->image);
  free (st->snap);
  free (st->id);
  free (st->conf);
  free (st);
}

static void
store_close (struct mloop_store *s)
{
  struct rbd_store *st = store_of (s);
  const bool orphaned = stop_lock_checker (st);

  if (st->stale) {
    /* The update watch is on the first open. */
    if (st->watching)
      rbd_update_unwatch (st->stale, st->watch_handle);
    rbd_close (st->stale);
  } else if (st->rbd) {
    if (st->watching)
      rbd_update_unwatch (st->rbd, st->watch_handle);
    if (st->locked)
      rbd_lock_release (st->rbd);
  }
  if (st->rbd)
    rbd_close (st->rbd);
  /* Or the checker's open, still under way, frees it (finish_orphaned). */
  if (orphaned && !let_go (st))
    return;
  release_store (st);
}

static const struct mloop_store_ops rbd_ops = {
  .kind = "rbd",
  .probe_features = store_probe_features,
  .quiesce = store_quiesce,
  .close = store_close,
  .prepare = store_prepare,
  .perform_blocking = store_perform_blocking,
  .complete_blocking = store_complete_blocking,
  .perform_event = store_perform_event,
  .abandon = store_abandon,
  .complete_event = store_complete_event,
  .flush = store_flush_now,
  .trim = store_trim,
  .zero = store_zero,
  .extents = store_extents,
  .reprobe_size = store_reprobe_size,
  .set_size = store_set_size,
  .size = store_size,
  .describe = store_describe,
};

/* The options a name may carry after the image, as qemu spells them:
 * ":id=NAME", ":conf=FILE", ":shared=on|off".  id and conf win over the
 * configuration's (mloop attach records the device's this way, so that
 * every server restarted for it connects the same); shared=on or the
 * configuration's shared, either one, takes no lock.
 */
static int
parse_option (struct rbd_store *st, const char *opt, char *err,
              size_t errlen)
{
  const char *eq = strchr (opt, '=');
  const char *value = eq ? eq + 1 : "";
  const size_t key_len = eq ? (size_t) (eq - opt) : strlen (opt);
  char **to = NULL;

  if (key_len == 2 && strncmp (opt, "id", 2) == 0)
    to = &st->id;
  else if (key_len == 4 && strncmp (opt, "conf", 4) == 0)
    to = &st->conf;
  else if (key_len == 6 && strncmp (opt, "shared", 6) == 0) {
    if (strcmp (value, "on") != 0 && strcmp (value, "off") != 0) {
      snprintf (err, errlen, "%s: shared=%s: must be on or off", st->name,
                value);
      return -EINVAL;
    }
    /* "off" is the default, and takes back no caller's request for no
     * lock: mloop resize opens a device's image shared, beside the
     * server that holds the lock, and a name the device was attached by
     * with ":shared=off" would otherwise have it take that lock, break
     * the server's and blocklist it (it is a recorded server).
     */
    if (strcmp (value, "on") == 0)
      st->shared = true;
    return 0;
  }
  if (to == NULL || *value == '\0') {
    snprintf (err, errlen, "%s: '%s': expected id=NAME, conf=FILE or "
              "shared=on|off after the image", st->name, opt);
    return -EINVAL;
  }
  free (*to);
  if ((*to = strdup (value)) == NULL)
    return -ENOMEM;
  return 0;
}

/* Splits "rbd:[POOL/]IMAGE[@SNAP][:OPTION...]" into ST's pool, image,
 * snap and options, over CFG's defaults.
 */
static int
parse_name (struct rbd_store *st, const struct mloop_engine_config *cfg,
            char *err, size_t errlen)
{
  char *spec = strdup (st->name + strlen (MLOOP_RBD_PREFIX));
  char *options, *slash, *ns_slash, *at, *image, *ns = NULL;
  int r = 0;

  st->shared = cfg->shared;
  st->id = cfg->ceph_id ? strdup (cfg->ceph_id) : NULL;
  st->conf = cfg->ceph_conf ? strdup (cfg->ceph_conf) : NULL;
  if (spec == NULL || (cfg->ceph_id && st->id == NULL) ||
      (cfg->ceph_conf && st->conf == NULL)) {
    free (spec);
    snprintf (err, errlen, "no memory for %s", st->name);
    return -ENOMEM;
  }
  options = strchr (spec, ':');
  if (options)
    *options++ = '\0';
  slash = strchr (spec, '/');
  image = slash ? slash + 1 : spec;
  if (slash)
    *slash = '\0';
  /* POOL/NAMESPACE/IMAGE: a namespace of the pool (ceph-csi's). */
  ns_slash = slash ? strchr (image, '/') : NULL;
  if (ns_slash) {
    ns = image;
    *ns_slash = '\0';
    image = ns_slash + 1;
  }
  at = strchr (image, '@');
  if (at)
    *at++ = '\0';
  st->pool = strdup (slash ? spec : DEFAULT_POOL);
  st->ns = ns ? strdup (ns) : NULL;
  st->image = strdup (image);
  st->snap = at ? strdup (at) : NULL;
  if (st->pool == NULL || st->image == NULL || (at && st->snap == NULL) ||
      (ns && st->ns == NULL))
    r = -ENOMEM;
  else if (st->pool[0] == '\0' || st->image[0] == '\0' ||
           (ns && ns[0] == '\0') ||
           strchr (image, '/') || (at && (*at == '\0' || strchr (at, '@')))) {
    snprintf (err, errlen, "%s: expected rbd:POOL/IMAGE, "
              "rbd:POOL/NAMESPACE/IMAGE, each with @SNAPSHOT or not",
              st->name);
    r = -EINVAL;
  }
  while (r == 0 && options) {
    char *next = strchr (options, ':');

    if (next)
      *next++ = '\0';
    r = parse_option (st, options, err, errlen);
    options = next;
  }
  if (r == -ENOMEM)
    snprintf (err, errlen, "no memory for %s", st->name);
  free (spec);
  return r;
}

/* Ceph's default client_mount_timeout made MOUNT_TIMEOUT, after the
 * configuration is read: a value set with rados_conf_set is at the
 * override level, which a configuration file's does not beat, so it is
 * set only where the file and $CEPH_ARGS left the default.
 */
static void
lower_mount_timeout (struct rbd_store *st)
{
  char value[32];

  if (rados_conf_get (st->cluster, "client_mount_timeout", value,
                      sizeof value) == 0 &&
      strtod (value, NULL) == CEPH_MOUNT_TIMEOUT)
    rados_conf_set (st->cluster, "client_mount_timeout", MOUNT_TIMEOUT);
}

/* Whether FD, an open file's, may be trusted to say what this process
 * does: a regular file of this user's or root's, that no one else may
 * write.
 */
static bool
trusted_file (int fd)
{
  struct stat st;

  return fstat (fd, &st) == 0 && S_ISREG (st.st_mode) &&
    (st.st_uid == geteuid () || st.st_uid == 0) &&
    (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* What read_conf made of the configuration. */
enum conf_verdict {
  CONF_READ,                    /* or failed as librados says */
  CONF_REFUSED,                 /* not trusted */
  CONF_PATH_REFUSED,            /* its path could be led elsewhere */
  CONF_PLACE_UNKNOWN,           /* $CEPH_CONF names a place not understood */
};

/* CONF, a configuration named, made absolute as this process opens it
 * (after the working directory when relative), so that its whole path
 * can be walked: malloc'ed, or NULL with errno.
 */
static char *
absolute_conf (const char *conf)
{
  char *cwd, *abs;

  if (conf[0] == '/')
    return strdup (conf);
  if ((cwd = getcwd (NULL, 0)) == NULL)
    return NULL;
  if (asprintf (&abs, "%s/%s", cwd, conf) < 0)
    abs = NULL;
  free (cwd);
  return abs;
}

/* Reads ST's configuration file into its cluster handle, or the file
 * librados's own search would find when none is named
 * (ceph_conf.h).  It is read only when it can be trusted
 * (trusted_file): it says which cluster is served, and where librados
 * writes its log (log_file), binds its admin socket and loads its
 * plugins from, as this process's user, root for a device's server,
 * which its supervisor restarts at any time, and for `mloop resize`,
 * run in whatever directory its caller is in (the search's last place
 * is the working directory's ceph.conf): one another user could write
 * would let that user create or append to any file, and serve their
 * image.  It is judged as opened, a link followed (/etc/ceph/ceph.conf
 * may be one), and read through that descriptor, so that what was
 * judged is what is read.  A file named (a device's recorded conf=) is
 * opened by name, its path walked first (trusted_path.h) at every
 * start, not only when `mloop attach` recorded it: a directory of
 * root's on the way, in /tmp, may since have been removed by a cleaner
 * and made again by a user, whose link there would lead this start to
 * another cluster's configuration of root's, which the judgement of
 * the file alone passes.  0, or a negative errno with the file's name
 * in *FILE (malloc'ed) and in *VERDICT why (CONF_PATH_REFUSED: the
 * entry in WHY).
 */
static int
read_conf (struct rbd_store *st, char **file, enum conf_verdict *verdict,
           char *why, size_t whylen)
{
  char fd_path[64];
  int fd, r;

  *verdict = CONF_READ;
  *file = NULL;
  if (st->conf == NULL) {
    fd = mloop_ceph_conf_open_searched (file);
    if (fd == -ENOTSUP)
      *verdict = CONF_PLACE_UNKNOWN;
  }
  else {
    char *abs;

    struct stat sb;
    bool special = false;
    int seen;

    *file = strdup (st->conf);
    if ((abs = absolute_conf (st->conf)) == NULL)
      return -errno;
    /* Looked at first, walked after: an entry that changed hands before
     * the look is another's at the walk (no user can make theirs look
     * root's), and one that changes after it no longer matters.  Never
     * opened for reading but as it was looked at (a FIFO's writer would
     * wake, a device node act).
     */
    seen = open (abs, O_PATH | O_CLOEXEC);
    if (seen < 0)
      fd = -errno;
    else if (!mloop_path_trusted (abs, why, whylen)) {
      close (seen);
      free (abs);
      *verdict = CONF_PATH_REFUSED;
      return -EPERM;
    }
    else if (fstat (seen, &sb) < 0 || !S_ISREG (sb.st_mode))
      special = true;
    else {
      char through[64];

      snprintf (through, sizeof through, "/proc/self/fd/%d", seen);
      fd = open (through, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0)
        fd = -errno;
    }
    if (seen >= 0)
      close (seen);
    free (abs);
    if (special) {
      *verdict = CONF_REFUSED;
      return -EPERM;
    }
  }
  if (fd < 0)
    return fd;
  if (!trusted_file (fd)) {
    close (fd);
    *verdict = CONF_REFUSED;
    return -EPERM;
  }
  snprintf (fd_path, sizeof fd_path, "/proc/self/fd/%d", fd);
  r = rados_conf_read_file (st->cluster, fd_path);
  close (fd);
  return r;
}

/* Connects to the cluster as CFG says: its configuration file (or
 * librados's own search), $CEPH_ARGS, the cephx user.  The cluster's
 * name, which librados puts for $cluster in the configuration's values
 * (the default keyring /etc/ceph/$cluster.$name.keyring, a log_file's,
 * an admin_socket's), is the one librados takes from the file named
 * (ceph_conf.h), or "ceph" with none named, whatever file its search
 * finds: read_conf hands librados /proc/self/fd/N, whose name would
 * make it "ceph" every time, so the store names the cluster itself.
 */
static int
connect_cluster (struct rbd_store *st, char *err, size_t errlen)
{
  const char *who = st->id ? st->id : "admin";
  enum conf_verdict verdict;
  char *file, *entity = NULL, why[1024];
  char *cluster = mloop_ceph_cluster_name (st->conf);
  int r = -ENOMEM;

  if (cluster && asprintf (&entity, "client.%s", who) < 0)
    entity = NULL;
  if (cluster && entity)
    r = rados_create2 (&st->cluster, cluster, entity, 0);
  free (cluster);
  free (entity);
  if (r < 0) {
    st->cluster = NULL;
    snprintf (err, errlen, "%s: librados: %s", st->name, strerror (-r));
    return r;
  }
  r = read_conf (st, &file, &verdict, why, sizeof why);
  if (verdict == CONF_PATH_REFUSED)
    snprintf (err, errlen, "%s: Ceph configuration %s: refused: keep it "
              "where only root (or the server's user) may change it",
              st->name, why);
  else if (verdict == CONF_REFUSED)
    snprintf (err, errlen, "%s: %s: refused: a Ceph configuration must be "
              "a file of this user's or root's that no one else may write, "
              "since it says which cluster is served and where its log is "
              "written", st->name, file ? file : "(its file)");
  else if (verdict == CONF_PLACE_UNKNOWN)
    snprintf (err, errlen, "%s: $CEPH_CONF's %s: only $cluster and $home "
              "are understood there (or say --ceph-conf)", st->name, file);
  else if (r < 0 && st->conf)
    snprintf (err, errlen, "%s: reading Ceph configuration %s: %s",
              st->name, st->conf, strerror (-r));
  else if (r < 0 && file)
    snprintf (err, errlen, "%s: reading Ceph configuration %s (librados's "
              "search): %s", st->name, file, strerror (-r));
  else if (r < 0)
    snprintf (err, errlen, "%s: no Ceph configuration found ($CEPH_CONF, "
              "/etc/ceph/ceph.conf; or say --ceph-conf)", st->name);
  free (file);
  if (r < 0)
    return r;
  rados_conf_parse_env (st->cluster, NULL);
  lower_mount_timeout (st);
  /* No cache between the device and the OSDs (see the top). */
  rados_conf_set (st->cluster, "rbd_cache", "false");
  /* --io-timeout, over the configuration's: a request to an OSD, or to
   * a monitor (a map, a lock), fails with -ETIMEDOUT in that time.
   */
  if (st->io_timeout) {
    char secs[16];

    snprintf (secs, sizeof secs, "%u", st->io_timeout);
    rados_conf_set (st->cluster, "rados_osd_op_timeout", secs);
    rados_conf_set (st->cluster, "rados_mon_op_timeout", secs);
  }
  r = rados_connect (st->cluster);
  if (r < 0) {
    snprintf (err, errlen, "%s: connecting to the Ceph cluster as "
              "client.%s: %s", st->name, who,
              r == -ENOENT ? "no keyring for that user"
              : r == -ETIMEDOUT ? "no monitor answered"
              : r == -EACCES || r == -EPERM ? "cephx refused the key"
              : strerror (-r));
    return r;
  }
  /* Without it, a timeout the configuration sets, for the notices. */
  if (st->io_timeout == 0) {
    char secs[32];

    if (rados_conf_get (st->cluster, "rados_osd_op_timeout", secs,
                        sizeof secs) == 0)
      st->io_timeout = (unsigned) strtoul (secs, NULL, 10);
  }
  r = rados_ioctx_create (st->cluster, st->pool, &st->ioctx);
  if (r < 0) {
    st->ioctx = NULL;
    snprintf (err, errlen, "%s: %s", st->name,
              r == -ENOENT ? "no such pool" : strerror (-r));
    return r;
  }
  if (st->ns) {
    bool exists = false;

    rados_ioctx_set_namespace (st->ioctx, st->ns);
    r = rbd_namespace_exists (st->ioctx, st->ns, &exists);
    if (r == 0 && !exists)
      r = -ENOENT;
    if (r < 0) {
      snprintf (err, errlen, "%s: %s", st->name,
                r == -ENOENT ? "no such namespace in the pool"
                : strerror (-r));
      return r;
    }
  }
  return 0;
}

/* Opens PATH, a record of the device's servers or of its image, into
 * *F when it can be trusted: a regular file, not a link, of this user's
 * or root's, that no one else may write.  A record says whose lock is
 * broken and whose watch is not counted, and which image is served:
 * one that another user could write (a path in /tmp, say) would let
 * that user have a live client's lock broken, the client blocklisted
 * and its image served here.  0, or a negative errno: -EPERM, -ELOOP
 * (a link) for a record not to be trusted.
 */
static int
open_record (const char *path, FILE **f)
{
  /* Not blocking: a FIFO put there would hold the open up forever. */
  int fd = open (path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC), r;

  *f = NULL;
  if (fd < 0)
    return -errno;
  if (!trusted_file (fd)) {
    close (fd);
    return -EPERM;
  }
  if ((*f = fdopen (fd, "r")) == NULL) {
    r = -errno;
    close (fd);
    return r;
  }
  return 0;
}

/* Whether R, open_record's answer, refuses the record as untrusted. */
static bool
untrusted (int r)
{
  return r == -EPERM || r == -ELOOP;
}

/* ERR for a record at PATH open_record refused with R. */
static void
say_untrusted (struct rbd_store *st, const char *path, int r, char *err,
               size_t errlen)
{
  snprintf (err, errlen, "%s: %s: %s", st->name, path,
            untrusted (r) ? "refused: a record must be a file of this "
            "user's or root's that no one else may write, since it says "
            "whose lock is broken and which image is served"
            : strerror (-r));
}

/* The device's servers recorded in PATH before us, in OWNER: 1, 0 when
 * there are none (or the record cannot be read: then no lock is broken
 * and no watch ignored, the safe way round), or a negative errno for a
 * record not to be trusted (open_record).
 */
static int
read_record (const char *path, char *owner, size_t len)
{
  FILE *f;
  size_t got;
  int r = path ? open_record (path, &f) : -ENOENT;

  owner[0] = '\0';
  if (r < 0)
    return untrusted (r) ? r : 0;
  got = fread (owner, 1, len - 1, f);
  fclose (f);
  owner[got] = '\0';
  return got > 0 && owner[0] != '\n';
}

/* Whether ADDR is one of the lines of the record HISTORY. */
static bool
in_history (const char *history, const char *addr)
{
  const size_t n = strlen (addr);

  for (const char *line = history; line && *line; ) {
    const char *end = strchrnul (line, '\n');

    if ((size_t) (end - line) == n && strncmp (line, addr, n) == 0)
      return true;
    line = *end ? end + 1 : NULL;
  }
  return false;
}

/* The lock's holder as the record names it (malloc'ed), or NULL. */
static char *
lock_holder (struct rbd_store *st)
{
  rbd_lock_mode_t mode;
  char *owners[1];
  size_t n = 1;
  char *holder = NULL;

  if (rbd_lock_get_owners (st->rbd, &mode, owners, &n) != 0)
    return NULL;
  if (n == 1)
    holder = strdup (owners[0]);
  rbd_lock_get_owners_cleanup (owners, n);
  return holder;
}

/* The lock just taken was taken from us at once, or whether it was
 * cannot be told (R, rbd_is_exclusive_lock_owner's error).  A break
 * tells librbd nothing: it still believes it holds the lock, and would
 * write beside the new holder.  That belief is dropped, as
 * check_lock_record does, so that the next write is answered EROFS and
 * takes the lock again once it is free (regained), having looked at
 * who holds it then.
 */
static void
drop_taken_lock (struct rbd_store *st, int r)
{
  rbd_lock_release (st->rbd);
  if (r < 0)
    say (st, "%s: whether this server still holds the exclusive lock it "
         "took cannot be told (%s): let go, a write takes it again once "
         "it is free", st->name, strerror (-r));
  else
    say (st, "%s: its exclusive lock was taken from this server as it "
         "took it: a write takes it again once it is free", st->name);
}

/* The address the cluster records the lock we just took under
 * (malloc'ed), or NULL when that cannot be told.  The owner is read
 * after the lock was taken, and is ours only if librbd still holds the
 * lock once it has been read: a client breaking it meanwhile without
 * blocklisting us (rbd_blocklist_on_break_lock false) and taking it
 * would otherwise be taken for this server, written into the device's
 * lock record as one of its servers (its lock broken and itself
 * blocklisted by the next), and never judged by its watch.  Where
 * librbd cannot say whether it still holds the lock, it is let go all
 * the same: librbd would go on writing under a lock that may be that
 * client's.  So it is when the holder's address cannot be read: not
 * knowing it, the lock record's check (check_lock_record) never runs,
 * and a break librbd does not see would never be found; a write takes
 * the lock again and reads it then (know_own_lock).
 */
static char *
own_lock_address (struct rbd_store *st)
{
  char *holder = lock_holder (st);
  int owner = 0;
  int r = rbd_is_exclusive_lock_owner (st->rbd, &owner);

  if (r == 0 && owner && holder == NULL)
    r = -EIO;                   /* whose it is cannot be told */
  if (r < 0 || !owner) {
    drop_taken_lock (st, r);
    free (holder);
    holder = NULL;
  }
  return holder;
}

/* The lock taken again (regained) with no address of ours known for it
 * (the start read none, or let the lock go): learns it as the start
 * does, and starts the lock record's check, without which a break
 * librbd does not see would never be found (check_lock_record).
 * Called with regain_lock held.
 */
static void
know_own_lock (struct rbd_store *st)
{
  if (st->own_address != NULL)
    return;
  st->own_address = own_lock_address (st);
  if (st->own_address && st->watching &&
      !__atomic_load_n (&st->checker_running, __ATOMIC_ACQUIRE) &&
      pthread_create (&st->checker, NULL, lock_checker, st) == 0)
    __atomic_store_n (&st->checker_running, true, __ATOMIC_RELEASE);
}

/* Replaces PATH with TEXT whole or not at all: through a temporary,
 * synced before the rename and the directory after it, so that neither
 * a server killed meanwhile nor a power cut leaves half a record, nor
 * an empty one, for the next server to read.  The temporary is a fresh
 * file: a link left there, where whoever chose PATH can write, must
 * not be written through.  0, or a negative errno.
 */
static int
replace_file (const char *path, const char *text)
{
  const size_t len = strlen (text);
  char *tmp, *dir, *slash;
  size_t done = 0;
  int fd, r = 0;

  if (asprintf (&tmp, "%s.tmp", path) < 0)
    return -ENOMEM;
  unlink (tmp);
  fd = open (tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    r = -errno;
    free (tmp);
    return r;
  }
  while (r == 0 && done < len) {
    ssize_t n = write (fd, text + done, len - done);

    if (n < 0 && errno != EINTR)
      r = -errno;
    else if (n > 0)
      done += (size_t) n;
  }
  if (r == 0 && fsync (fd) < 0)
    r = -errno;
  if (close (fd) < 0 && r == 0)
    r = -errno;
  if (r == 0 && rename (tmp, path) < 0)
    r = -errno;
  if (r < 0)
    unlink (tmp);
  free (tmp);
  /* The rename itself, through a power cut. */
  if (r == 0 && (dir = strdup (path)) != NULL) {
    slash = strrchr (dir, '/');
    if (slash)
      slash[slash == dir ? 1 : 0] = '\0';
    fd = open (slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      fsync (fd);
      close (fd);
    }
    free (dir);
  }
  return r;
}

/* Records ADDRESS, a server of the device (best effort: without it a
 * successor waits for librbd instead), in PATH: first, then the
 * device's earlier servers, newest first, RECORD_HISTORY in all.  A
 * recorded server's lock is broken by the next, and its watch, which
 * lingers osd_client_watch_timeout after its death, is no sign of life
 * when a device's servers are killed one after another (take_lock).
 */
#define RECORD_HISTORY 8
#define RECORD_LINE_MOST 128    /* an address; "[v2:IPv6]:port/nonce" fits */
#define RECORD_MOST (RECORD_HISTORY * (RECORD_LINE_MOST + 1) + 1)

static void
write_record (const char *path, const char *address)
{
  char old[RECORD_MOST], text[RECORD_MOST];
  size_t used;
  unsigned kept = 1;

  if (path == NULL || address == NULL || strlen (address) > RECORD_LINE_MOST)
    return;
  if (read_record (path, old, sizeof old) <= 0)
    old[0] = '\0';
  used = (size_t) snprintf (text, sizeof text, "%s\n", address);
  for (char *line = old; *line && kept < RECORD_HISTORY; ) {
    char *end = strchrnul (line, '\n');
    const bool last = *end == '\0';

    *end = '\0';
    if (*line && strcmp (line, address) != 0 &&
        strlen (line) <= RECORD_LINE_MOST) {
      used += (size_t) snprintf (text + used, sizeof text - used, "%s\n",
                                 line);
      kept++;
    }
    if (last)
      break;
    line = end + 1;
  }
  replace_file (path, text);
}

/* The open image's effective configuration (client, pool and image
 * levels, as librbd applies them), in *OPTIONS and *N: 0, or a negative
 * errno.  free_options gives it back.
 */
static int
image_options (struct rbd_store *st, rbd_config_option_t **options, int *n)
{
  int r;

  *options = NULL;
  *n = 0;
  r = rbd_config_image_list (st->rbd, NULL, n);
  if (r == -ERANGE && *n > 0) {
    if ((*options = calloc ((size_t) *n, sizeof **options)) == NULL)
      return -ENOMEM;
    r = rbd_config_image_list (st->rbd, *options, n);
  }
  if (r < 0 || *options == NULL) {
    free (*options);
    *options = NULL;
    return r < 0 ? r : -ENOENT;
  }
  return 0;
}

static void
free_options (rbd_config_option_t *options, int n)
{
  rbd_config_image_list_cleanup (options, n);
  free (options);
}

/* OPTION's value in OPTIONS, or NULL. */
static const char *
option_value (const rbd_config_option_t *options, int n, const char *option)
{
  for (int i = 0; i < n; i++)
    if (strcmp (options[i].name, option) == 0)
      return options[i].value;
  return NULL;
}

/* How long the cluster is to refuse a holder whose lock we break: the
 * image's rbd_blocklist_expire_seconds, which librbd blocklists for
 * (its pool's or its own configuration may set it, to fence longer than
 * the monitors' default hour); 0, that default, when it is unset or not
 * understood (librbd would not apply such a value either).
 */
static uint32_t
blocklist_seconds (struct rbd_store *st)
{
  rbd_config_option_t *options;
  const char *value;
  unsigned long long secs = 0;
  char *end;
  int n;

  if (image_options (st, &options, &n) < 0)
    return 0;
  value = option_value (options, n, "rbd_blocklist_expire_seconds");
  /* Digits only: strtoull would take " -1" for a huge number. */
  if (value && *value && strspn (value, "0123456789") == strlen (value)) {
    errno = 0;
    secs = strtoull (value, &end, 10);
    if (errno != 0 || secs > UINT32_MAX)
      secs = 0;
  }
  free_options (options, n);
  return (uint32_t) secs;
}

/* Breaks OWNER's lock, having the cluster refuse OWNER first, for as
 * long as librbd would (blocklist_seconds): a holder taken for dead may
 * be only stopped, and once continued it would write beside us until
 * its watch came back.  librbd blocklists the holder itself only where
 * rbd_blocklist_on_break_lock is true, which the configuration, the
 * pool's or the image's may turn off; so the store does it whatever
 * they say (when librbd does too, the second entry is the first
 * renewed, for as long).  A holder that cannot be fenced keeps its
 * lock.
 */
static int
break_lock (struct rbd_store *st, const char *owner)
{
  int r = rados_blocklist_add (st->cluster, (char *) owner,
                               blocklist_seconds (st));

  return r < 0 ? r : rbd_lock_break (st->rbd, RBD_LOCK_MODE_EXCLUSIVE, owner);
}

/* When the lock's holder is one of the device's servers HISTORY
 * records, breaks its lock (which also blocklists it: were it alive
 * after all, it could write no more) so that the caller can take it:
 * its watch may outlive it by osd_client_watch_timeout, and is no sign
 * of life.  librbd breaks a lock only when given its holder's address
 * whole, so the holder's own string is given, not a line of HISTORY.
 */
static void
break_recorded (struct rbd_store *st, const char *history)
{
  rbd_lock_mode_t mode;
  char *owners[4];
  size_t n = 4;

  if (rbd_lock_get_owners (st->rbd, &mode, owners, &n) != 0)
    return;
  if (n == 1 && in_history (history, owners[0]))
    break_lock (st, owners[0]);
  rbd_lock_get_owners_cleanup (owners, n);
}

/* The image's watchers other than us (rbd_watchers_list): a client
 * with the image open for writing watches its header for as long as it
 * lives (a read-only librbd open does not watch); a dead one's watch
 * ends osd_client_watch_timeout (30 s) after its last word.  There may
 * be any number (every open of the image is one), so the list grows to
 * what librbd says it needs.
 */
#define FIRST_WATCHERS 16

struct peers {
  rbd_image_watcher_t *watchers;
  size_t n;
};

static void
free_peers (struct peers *p)
{
  if (p->watchers)
    rbd_watchers_list_cleanup (p->watchers, p->n);
  free (p->watchers);
  p->watchers = NULL;
  p->n = 0;
}

/* Every watcher of the image, us included, into P. */
static int
read_watchers (struct rbd_store *st, struct peers *p)
{
  size_t room = FIRST_WATCHERS;
  int r;

  p->watchers = NULL;
  p->n = 0;
  do {
    free (p->watchers);
    /* One more than asked for: it may have grown since librbd said. */
    if ((p->watchers = calloc (room + 1, sizeof *p->watchers)) == NULL)
      return -ENOMEM;
    p->n = room + 1;
    r = rbd_watchers_list (st->rbd, p->watchers, &p->n);
    room = p->n;
  } while (r == -ERANGE);
  if (r < 0) {
    free (p->watchers);
    p->watchers = NULL;
    p->n = 0;
  }
  return r;
}

/* The image's watchers but ours and those HISTORY records, into P; our
 * own watch's address (malloc'ed, or NULL) into *OWN.
 */
static int
list_peers (struct rbd_store *st, const char *history, struct peers *p,
            char **own)
{
  const int64_t self = (int64_t) rados_get_instance_id (st->cluster);
  size_t i, kept = 0;
  int r = read_watchers (st, p);

  *own = NULL;
  if (r < 0)
    return r;
  for (i = 0; i < p->n; i++) {
    if (p->watchers[i].id == self && *own == NULL)
      *own = strdup (p->watchers[i].addr);
    if (p->watchers[i].id == self ||
        (history && in_history (history, p->watchers[i].addr)))
      rbd_watchers_list_cleanup (&p->watchers[i], 1);
    else
      p->watchers[kept++] = p->watchers[i];
  }
  p->n = kept;
  return 0;
}

/* Our own watch's address (malloc'ed), or NULL: the address the
 * cluster will name the lock's holder by once we hold it, as
 * refuse_live_peers matches owners with watchers.
 */
static char *
own_watch_address (struct rbd_store *st)
{
  const int64_t self = (int64_t) rados_get_instance_id (st->cluster);
  struct peers p;
  char *addr = NULL;

  if (read_watchers (st, &p) < 0)
    return NULL;
  for (size_t i = 0; i < p.n && addr == NULL; i++)
    if (p.watchers[i].id == self)
      addr = strdup (p.watchers[i].addr);
  free_peers (&p);
  return addr;
}

/* The watcher that is the lock's OWNER, or NULL.  librbd names an
 * owner by its client's address (rbd_lock_get_owners), a watcher by
 * both.
 */
static const rbd_image_watcher_t *
watcher_of (const struct peers *p, const char *owner)
{
  for (size_t i = 0; i < p->n; i++)
    if (strcmp (p->watchers[i].addr, owner) == 0)
      return &p->watchers[i];
  return NULL;
}

/* librbd's name for the exclusive lock on an image's header (its
 * RBD_LOCK_NAME, which the C API does not export), and the room for the
 * list of that lock's entries: one each, and a few addresses, fit.
 */
#define HEADER_LOCK_NAME "rbd_lock"
#define LOCKERS_ROOM 1024

/* Removes the entries of the image's exclusive lock that are this very
 * client's, which the cluster records and librbd does not know of:
 * librbd takes a release whose unlock never reached the cluster (a
 * timeout, an OSD restarted) for done, so a lock it let go can stay
 * recorded as this server's.  Nothing then frees it: not librbd, which
 * holds nothing, nor another client, which finds our watch alive; and
 * breaking it (break_lock) would blocklist this very client.  Only
 * where librbd says it holds nothing: one that cannot say (a timeout)
 * may hold the lock after all, and letting it go would hand it to any
 * live client on the image at its next write, the device's writes then
 * failing.  librbd is then made to let go of whatever it believes it
 * holds all the same (EINVAL: nothing), so that no write of ours is
 * under way beneath the entry removed; then each entry of ours is
 * unlocked by its cookie, which cls_lock allows only its own client:
 * never another's entry, and no client blocklisted.  0, or a negative
 * errno (-EBUSY: librbd holds the lock, or may).
 */
static int
let_go_own_record (struct rbd_store *st)
{
  char image_id[RBD_MAX_IMAGE_NAME_SIZE], self[32], *oid;
  char tag[LOCKERS_ROOM], clients[LOCKERS_ROOM], cookies[LOCKERS_ROOM];
  char addrs[LOCKERS_ROOM];
  size_t tag_len = sizeof tag, clients_len = sizeof clients;
  size_t cookies_len = sizeof cookies, addrs_len = sizeof addrs;
  const char *client = clients, *cookie = cookies;
  int exclusive, owner = 0, r = rbd_is_exclusive_lock_owner (st->rbd, &owner);
  ssize_t n;

  if (r < 0 || owner)
    return -EBUSY;              /* librbd holds it, or may */
  if ((r = rbd_lock_release (st->rbd)) < 0 && r != -EINVAL)
    return r;                   /* librbd may still hold it */
  if ((r = rbd_get_id (st->rbd, image_id, sizeof image_id)) < 0)
    return r;
  if (asprintf (&oid, "rbd_header.%s", image_id) < 0)
    return -ENOMEM;
  snprintf (self, sizeof self, "client.%" PRIu64,
            rados_get_instance_id (st->cluster));
  n = rados_list_lockers (st->ioctx, oid, HEADER_LOCK_NAME, &exclusive,
                          tag, &tag_len, clients, &clients_len, cookies,
                          &cookies_len, addrs, &addrs_len);
  r = n < 0 ? (int) n : 0;
  for (ssize_t i = 0; i < n && r == 0; i++) {
    if (strcmp (client, self) == 0 &&
        (r = rados_unlock (st->ioctx, oid, HEADER_LOCK_NAME, cookie))
        == -ENOENT)
      r = 0;                    /* gone meanwhile */
    client += strlen (client) + 1;
    cookie += strlen (cookie) + 1;
  }
  free (oid);
  return r;
}

/* Refuses an image another client lives on, naming it; breaks the lock
 * of a holder that is gone (which blocklists it: were it alive after
 * all, it could write no more).  The watches of the device's servers
 * HISTORY records (NULL: none) are not counted (see take_lock), and a
 * holder that is this server itself is named, never broken
 * (rbd_peers_judge says why).  Asking a live holder for the lock
 * instead, as rbd_lock_acquire does, would have it hand the lock over
 * (krbd, rbd-nbd and qemu do) and fail its next write (EROFS), since
 * this store then never hands it back.
 */
static int
refuse_live_peers (struct rbd_store *st, const char *history, char *err,
                   size_t errlen)
{
  struct peers p;
  rbd_lock_mode_t mode;
  char *owners[4], *own = NULL;
  const char **addrs = NULL;
  size_t n = 4, which, dead;
  int r = 0;

  /* The owners first, then the watchers: a client takes the lock only
   * once its watch is up (the lock's cookie names the watch), so an
   * owner read before the list is on it if alive.  The other way round,
   * a client opening the image and taking the lock between the two
   * would be an owner missing from the list, taken for dead and broken.
   */
  /* Not knowing who holds the lock, asking librbd for it would have
   * librbd break it wherever the holder has no watch, blocklisting it
   * only where rbd_blocklist_on_break_lock says so: a holder only
   * stopped would write beside us once continued.  Refused instead.
   */
  if ((r = rbd_lock_get_owners (st->rbd, &mode, owners, &n)) == -ENOENT)
    n = 0;                      /* nobody holds it */
  else if (r < 0) {
    snprintf (err, errlen, "%s: reading who holds its exclusive lock, to "
              "tell a live holder from a dead one: %s", st->name,
              strerror (-r));
    return r;
  }
  /* Not knowing who lives on the image, asking for its lock could take
   * it from a live holder: refused instead.
   */
  if ((r = list_peers (st, history, &p, &own)) < 0) {
    snprintf (err, errlen, "%s: listing the clients that have it open, to "
              "tell a live lock holder from a dead one: %s", st->name,
              strerror (-r));
    if (n > 0)
      rbd_lock_get_owners_cleanup (owners, n);
    return r;
  }
  dead = n;                     /* broken below when no client lives */
  if ((addrs = calloc (p.n + 1, sizeof *addrs)) == NULL)
    r = -ENOMEM;
  for (size_t i = 0; addrs && i < p.n; i++)
    addrs[i] = p.watchers[i].addr;
  if (r == 0) {
    const char *self[2] = { own, st->own_address };
    enum rbd_peers_verdict verdict =
      rbd_peers_judge ((const char *const *) owners, n, addrs, p.n, self, 2,
                       &which);

    /* Our own lock, never broken: let go as ours, then the others
     * judged as if nobody held it.
     */
    if (verdict == RBD_PEERS_SELF_HOLDER &&
        (r = let_go_own_record (st)) == 0) {
      say (st, "%s: the cluster records this server (%s) as its exclusive "
           "lock's holder, which librbd does not know: let go, not broken "
           "(which would fence this server)", st->name, owners[which]);
      dead = 0;
      verdict = rbd_peers_judge ((const char *const *) owners, 0, addrs,
                                 p.n, self, 2, &which);
    }
    switch (verdict) {
    case RBD_PEERS_SELF_HOLDER:
      snprintf (err, errlen, "%s: the cluster records this server (%s) as "
                "its exclusive lock's holder, %s%s%s: its lock is not "
                "broken, which would fence this server", st->name,
                owners[which], r == -EBUSY ? "which librbd may hold: not "
                "let go" : "which librbd does not know, and letting it go "
                "failed (", r == -EBUSY ? "" : strerror (-r),
                r == -EBUSY ? "" : ")");
      r = -EBUSY;
      break;
    case RBD_PEERS_LIVE_HOLDER: {
      const rbd_image_watcher_t *w = watcher_of (&p, owners[which]);

      snprintf (err, errlen, "%s is in use: client.%" PRId64 " at %s "
                "holds its exclusive lock (--shared to write it alongside)",
                st->name, w->id, w->addr);
      r = -EBUSY;
      break;
    }
    case RBD_PEERS_LIVE_WRITER:
      snprintf (err, errlen, "%s is in use: client.%" PRId64 " at %s has it "
                "open for writing (--shared to write it alongside)",
                st->name, p.watchers[which].id, p.watchers[which].addr);
      r = -EBUSY;
      break;
    case RBD_PEERS_NONE_LIVE:
      break;
    }
  }
  /* Only now, no client alive on the image, are the dead owners' locks
   * broken.
   */
  for (size_t i = 0; i < dead && r == 0; i++) {
    if ((r = break_lock (st, owners[i])) == -ENOENT)
      r = 0;                    /* let go meanwhile */
    else if (r < 0)
      snprintf (err, errlen, "%s: breaking the lock of %s, which has no "
                "watch on it (dead): %s", st->name, owners[i],
                strerror (-r));
  }
  if (n > 0)
    rbd_lock_get_owners_cleanup (owners, n);
  free (addrs);
  free (own);
  free_peers (&p);
  return r;
}

/* Takes the image's exclusive lock, or says who holds it. */
static int
take_lock (struct rbd_store *st, const char *record, char *err,
           size_t errlen)
{
  uint64_t features = 0;
  rbd_lock_mode_t mode;
  char *owners[4], recorded[RECORD_MOST], *own;
  size_t n = 4;
  bool have;
  int r;

  if (rbd_get_features (st->rbd, &features) == 0 &&
      !(features & RBD_FEATURE_EXCLUSIVE_LOCK)) {
    snprintf (err, errlen, "%s: the image has no exclusive-lock feature, "
              "so its use by one writer cannot be ensured (`rbd feature "
              "enable IMAGE exclusive-lock`, or --shared)", st->name);
    return -EINVAL;
  }
  /* The device's earlier servers, newest first, then us before them,
   * before anything else: a server killed at any point after this, the
   * lock taken or not, is one of them to its successor.
   */
  if ((r = read_record (record, recorded, sizeof recorded)) < 0) {
    say_untrusted (st, record, r, err, errlen);
    return r;
  }
  have = r == 1;
  own = record ? own_watch_address (st) : NULL;
  write_record (record, own);
  /* A killed server of the device keeps its watch (and maybe the lock)
   * for osd_client_watch_timeout after its death, so it would look
   * alive: its lock is broken, and its watch not counted.  An earlier
   * server alive after all holds no lock then, and librbd writes only
   * under the lock.
   */
  if (have)
    break_recorded (st, recorded);
  if ((r = refuse_live_peers (st, have ? recorded : NULL, err, errlen)) < 0) {
    free (own);
    return r;
  }
  r = rbd_lock_acquire (st->rbd, RBD_LOCK_MODE_EXCLUSIVE);
  if (r == 0) {
    st->locked = true;
    st->lock_wanted = true;
    /* For the lock taken again (regained), which may be at the first
     * write, a killed predecessor's watch still up: own_lock_address
     * lets go of a lock whose holder it cannot read.  (Without the
     * memory, that watch keeps the lock out until it ends.)
     */
    st->history = have ? strdup (recorded) : NULL;
    st->own_address = own_lock_address (st);
    if (st->own_address && (own == NULL || strcmp (own, st->own_address)))
      write_record (record, st->own_address);
    free (own);
    return 0;
  }
  free (own);
  if (rbd_lock_get_owners (st->rbd, &mode, owners, &n) == 0 && n > 0) {
    snprintf (err, errlen, "%s is in use: %s holds its exclusive lock "
              "(--shared to write it alongside)", st->name, owners[0]);
    rbd_lock_get_owners_cleanup (owners, n);
  }
  else
    snprintf (err, errlen, "%s: taking its exclusive lock: %s", st->name,
              strerror (-r));
  return r;
}

/* Whether librbd may take VALUE, a boolean option's, for true.  An
 * image's or a pool's value is listed as it was set, not as librbd
 * reads it, and librbd reads as Ceph parses a boolean: "true" or
 * "false" in any case, else a decimal integer, true unless 0 (`rbd
 * config image set IMAGE rbd_cache 1` turns the cache on).  A value
 * not understood is taken for true, the safe way round.
 */
static bool
value_may_be_true (const char *value)
{
  char *end;
  long n;

  if (strcasecmp (value, "true") == 0)
    return true;
  if (strcasecmp (value, "false") == 0)
    return false;
  errno = 0;
  n = strtol (value, &end, 10);
  if (end == value || *end != '\0' || errno != 0)
    return true;
  return n != 0;
}

/* Whether librbd's effective OPTION, as ST's image sees it, may be true
 * (librbd lists every option of its own; one unlisted is not known, and
 * taken for true as well).
 */
static bool
option_on (const rbd_config_option_t *options, int n, const char *option)
{
  const char *value = option_value (options, n, option);

  return value == NULL || value_may_be_true (value);
}

/* What the image will do with writes.  The store asks for no cache,
 * but a client's own settings lose to the pool's and the image's (`rbd
 * config pool|image set`), stored in the cluster: only the open image
 * knows what it got.  Unreadable, the cache is assumed on, the safe way
 * round.
 */
static void
read_effective_config (struct rbd_store *st)
{
  rbd_config_option_t *options;
  int n;

  if (image_options (st, &options, &n) < 0) {
    st->write_back = true;
    return;
  }
  st->write_back = option_on (options, n, "rbd_cache");
  free_options (options, n);
  if (st->write_back && st->base.info.writable)
    say (st, "%s: its pool or image turns librbd's cache on: FUA writes "
         "are flushed", st->name);
}

/* ------------------------------------------------------ which image */

/* A device's servers serve the image its first server opened, whatever
 * the name names by then: `rbd mv` renames an image in use, and another
 * image, or another snapshot, may then take the name; a server started
 * again by the name (the supervisor's restart) would serve that one to
 * a device whose data is the first's.  So a server given a lock record
 * (a device's) records beside it, in FILE.image, the ids of the image
 * and of its snapshot, with the name they were opened by; the next
 * servers open the ids (rbd_open_by_id, rbd_snap_set_by_id), say when
 * the image has another name now, and are refused in one line when it
 * or its snapshot is gone.  The record's first line is the image's id
 * ("ID" or "ID@SNAPID"), the second the name ("POOL/[NS/]IMAGE[@SNAP]").
 */
#define IMAGE_RECORD_SUFFIX ".image"
#define IMAGE_RECORD_MOST (1 << 20)     /* names of any length Ceph takes */

struct image_record {
  char *id;                     /* NULL: none recorded */
  uint64_t snap_id;
  char *spec;
};

/* ST's name without its options, as the record says it. */
static char *
image_spec (const struct rbd_store *st)
{
  char *spec;

  if (asprintf (&spec, "%s/%s%s%s%s%s", st->pool, st->ns ? st->ns : "",
                st->ns ? "/" : "", st->image, st->snap ? "@" : "",
                st->snap ? st->snap : "") < 0)
    return NULL;
  return spec;
}

/* Parses BUF, a record's LEN bytes, into REC: 0, or -EBADMSG. */
static int
parse_image_record (char *buf, size_t len, bool with_snap,
                    struct image_record *rec)
{
  char *nl, *at, *end;

  if ((nl = strchr (buf, '\n')) == NULL || len < 2 || buf[len - 1] != '\n')
    return -EBADMSG;
  *nl = '\0';
  buf[len - 1] = '\0';
  if ((at = strchr (buf, '@')) != NULL) {
    *at++ = '\0';
    errno = 0;
    rec->snap_id = strtoull (at, &end, 10);
    if (*at < '0' || *at > '9' || *end != '\0' || errno != 0)
      return -EBADMSG;
  }
  if (buf[0] == '\0' || strspn (buf, "0123456789abcdefABCDEF") != strlen (buf)
      || (at != NULL) != with_snap)
    return -EBADMSG;
  rec->id = strdup (buf);
  rec->spec = strdup (nl + 1);
  if (rec->id == NULL || rec->spec == NULL)
    return -ENOMEM;
  return 0;
}

/* The whole text of PATH, a record (open_record), NUL-terminated, in
 * *TEXT (malloc'ed) and its length in *LEN: 0, or a negative errno
 * (-EFBIG: over MOST bytes; open_record's).
 */
static int
read_text (const char *path, size_t most, char **text, size_t *len)
{
  size_t room = 4096;
  char *buf = NULL, *grown;
  FILE *f;
  int r = open_record (path, &f);

  *text = NULL;
  *len = 0;
  if (r < 0)
    return r;
  for (;;) {
    if ((grown = realloc (buf, room + 1)) == NULL) {
      r = -ENOMEM;
      break;
    }
    buf = grown;
    *len += fread (buf + *len, 1, room - *len, f);
    if (*len < room)
      break;
    if (room >= most) {
      r = -EFBIG;
      break;
    }
    room *= 2;
  }
  if (r == 0 && ferror (f))
    r = -EIO;
  fclose (f);
  if (r < 0) {
    free (buf);
    return r;
  }
  buf[*len] = '\0';
  *text = buf;
  return 0;
}

/* Reads PATH into REC: 0 (REC->id NULL when there is no record), or a
 * negative errno (-EBADMSG: not a record of this kind).
 */
static int
read_image_record (const char *path, bool with_snap, struct image_record *rec)
{
  char *buf;
  size_t len;
  int r = read_text (path, IMAGE_RECORD_MOST, &buf, &len);

  *rec = (struct image_record) { 0 };
  if (r < 0)
    return r == -ENOENT ? 0 : r == -EFBIG ? -EBADMSG : r;
  r = parse_image_record (buf, len, with_snap, rec);
  free (buf);
  return r;
}

static void
image_record_clear (struct image_record *rec)
{
  free (rec->id);
  free (rec->spec);
  *rec = (struct image_record) { 0 };
}

/* Records the open image's ids and SPEC in PATH, whole or not at all
 * (replace_file): a server killed meanwhile leaves no half id.
 */
static int
write_image_record (struct rbd_store *st, const char *path, const char *spec)
{
  char id[RBD_MAX_IMAGE_NAME_SIZE], *text;
  int r = rbd_get_id (st->rbd, id, sizeof id);

  /* A format 1 image (long deprecated) has no id to open it by. */
  if (r == -EINVAL) {
    say (st, "%s: an image of format 1 has no id: a restarted server opens "
         "whatever has its name then", st->name);
    return 0;
  }
  if (r == 0 && st->snap && !st->snap_id_known)
    r = -ENOENT;
  if (r < 0)
    return r;
  if ((st->snap ? asprintf (&text, "%s@%" PRIu64 "\n%s\n", id, st->snap_id,
                            spec)
       : asprintf (&text, "%s\n%s\n", id, spec)) < 0)
    return -ENOMEM;
  r = replace_file (path, text);
  free (text);
  return r;
}

/* What ST's name names now, for a message: "; the name is now image
 * ID's" (or snapshot ID's), or that nothing has it.
 */
static void
named_now (struct rbd_store *st, char *buf, size_t len)
{
  rbd_image_t other;
  char id[RBD_MAX_IMAGE_NAME_SIZE];
  uint64_t snap_id;

  if (rbd_open_read_only (st->ioctx, st->image, &other, NULL) < 0) {
    snprintf (buf, len, "; no image has its name now");
    return;
  }
  if (st->snap && rbd_snap_get_id (other, st->snap, &snap_id) == 0)
    snprintf (buf, len, "; the name is now snapshot %" PRIu64 "'s",
              snap_id);
  else if (st->snap)
    snprintf (buf, len, "; no snapshot has its name now");
  else if (rbd_get_id (other, id, sizeof id) == 0)
    snprintf (buf, len, "; the name is now image %s's", id);
  else
    buf[0] = '\0';
  rbd_close (other);
}

/* Refuses the image of id ID when it is in the pool's trash (`rbd trash
 * mv`, or an `rbd rm` under way): librbd opens it by id all the same,
 * but its owner removed it, and `rbd trash purge` may remove its
 * objects under the server at any time.  0, or a negative errno with
 * ERR (the trash unreadable: not knowing, refused).
 */
static int
refuse_trashed (struct rbd_store *st, const char *id, char *err,
                size_t errlen)
{
  rbd_trash_image_info_t info;
  int r = rbd_trash_get (st->ioctx, id, &info);

  if (r == -ENOENT)
    return 0;
  if (r < 0) {
    snprintf (err, errlen, "%s: looking for the image its device was "
              "attached to (id %s) in the pool's trash: %s", st->name, id,
              strerror (-r));
    return r;
  }
  /* Not the name it has there: another client chose it, and it may
   * hold anything, a line break included.
   */
  snprintf (err, errlen, "%s: the image its device was attached to (id %s) "
            "is in the pool's trash (`rbd trash restore` of that id brings "
            "it back)", st->name, id);
  rbd_trash_get_cleanup (&info);
  return -ENOENT;
}

/* The open image's name now (malloc'ed), or NULL.  A name may be longer
 * than librbd's RBD_MAX_IMAGE_NAME_SIZE, a bound of format 1's: librbd
 * answers ERANGE with the length it needs.
 */
static char *
name_now (struct rbd_store *st)
{
  size_t len = RBD_MAX_IMAGE_NAME_SIZE;
  char *name = NULL;
  int r;

  do {
    free (name);
    if ((name = malloc (len)) == NULL)
      return NULL;
    r = rbd_get_name (st->rbd, name, &len);
  } while (r == -ERANGE);
  if (r < 0) {
    free (name);
    return NULL;
  }
  return name;
}

/* NAME, chosen by whichever client of the cluster gave it (`rbd mv`),
 * as a log may show it (malloc'ed), or NULL: every byte outside
 * printable ASCII, and a backslash, written \xHH.  Raw, a line break
 * would start a line the server never wrote, an escape sequence would
 * move the cursor of whoever reads the log, a bidi control reorder it.
 */
static char *
shown_name (const char *name)
{
  const size_t len = strlen (name);
  char *shown = malloc (4 * len + 1), *p = shown;

  if (shown == NULL)
    return NULL;
  for (const unsigned char *c = (const unsigned char *) name; *c; c++)
    if (*c < 0x20 || *c >= 0x7f || *c == '\\')
      p += sprintf (p, "\\x%02x", *c);
    else
      *p++ = (char) *c;
  *p = '\0';
  return shown;
}

/* Opens the image PATH records: 1, 0 when there is no record, or a
 * negative errno with ERR.
 */
static int
open_recorded (struct rbd_store *st, bool writable, const char *path,
               const char *spec, char *err, size_t errlen)
{
  struct image_record rec;
  char now[160], *name;
  int r = read_image_record (path, st->snap != NULL, &rec);

  if (r < 0 || rec.id == NULL) {
    if (untrusted (r))
      say_untrusted (st, path, r, err, errlen);
    else if (r < 0)
      snprintf (err, errlen, "%s: reading which image its device serves "
                "(%s): %s", st->name, path,
                r == -EBADMSG ? "not a record of an image" : strerror (-r));
    image_record_clear (&rec);
    return r;
  }
  if (strcmp (rec.spec, spec) != 0) {
    snprintf (err, errlen, "%s: %s records the image of another name, %s",
              st->name, path, rec.spec);
    image_record_clear (&rec);
    return -EINVAL;
  }
  if ((r = refuse_trashed (st, rec.id, err, errlen)) < 0) {
    image_record_clear (&rec);
    return r;
  }
  r = writable ? rbd_open_by_id (st->ioctx, rec.id, &st->rbd, NULL)
    : rbd_open_by_id_read_only (st->ioctx, rec.id, &st->rbd, NULL);
  if (r < 0) {
    st->rbd = NULL;
    if (r == -ENOENT)
      named_now (st, now, sizeof now);
    snprintf (err, errlen, "%s: the image its device was attached to "
              "(id %s) %s%s", st->name, rec.id,
              r == -ENOENT ? "is gone" : strerror (-r),
              r == -ENOENT ? now : "");
    image_record_clear (&rec);
    return r;
  }
  if (st->snap && (r = rbd_snap_set_by_id (st->rbd, rec.snap_id)) < 0) {
    if (r == -ENOENT)
      named_now (st, now, sizeof now);
    snprintf (err, errlen, "%s: the snapshot its device was attached to "
              "(id %" PRIu64 " of image %s) %s%s", st->name, rec.snap_id,
              rec.id, r == -ENOENT ? "is gone" : strerror (-r),
              r == -ENOENT ? now : "");
    image_record_clear (&rec);
    return r;
  }
  st->snap_id = rec.snap_id;
  st->snap_id_known = st->snap != NULL;
  if ((name = name_now (st)) != NULL && strcmp (name, st->image) != 0) {
    char *shown = shown_name (name);

    say (st, "%s: the image was renamed %s: served all the same, as the "
         "image its device was attached to (id %s)", st->name,
         shown ? shown : "(a name)", rec.id);
    free (shown);
  }
  free (name);
  image_record_clear (&rec);
  return 1;
}

/* Opens the image its name names, and records it in PATH (not NULL). */
static int
open_named (struct rbd_store *st, bool writable, const char *path,
            const char *spec, char *err, size_t errlen)
{
  int r = writable ? rbd_open (st->ioctx, st->image, &st->rbd, NULL)
    : rbd_open_read_only (st->ioctx, st->image, &st->rbd, st->snap);

  if (r < 0) {
    st->rbd = NULL;
    if (r == -ENOENT && st->snap)
      snprintf (err, errlen, "%s: no such image or snapshot", st->name);
    else
      snprintf (err, errlen, "%s: %s", st->name,
                r == -ENOENT ? "no such image" : strerror (-r));
    return r;
  }
  st->snap_id_known = st->snap &&
    rbd_snap_get_id (st->rbd, st->snap, &st->snap_id) == 0;
  if (path && (r = write_image_record (st, path, spec)) < 0) {
    snprintf (err, errlen, "%s: recording which image its device serves "
              "(%s): %s", st->name, path, strerror (-r));
    return r;
  }
  return 0;
}

static int
open_image (struct rbd_store *st, const struct mloop_engine_config *cfg,
            char *err, size_t errlen)
{
  const bool writable = cfg->want_write && st->snap == NULL;
  char *record = NULL, *spec = image_spec (st);
  int r = spec ? 0 : -ENOMEM;

  if (r == 0 && cfg->lock_record &&
      asprintf (&record, "%s" IMAGE_RECORD_SUFFIX, cfg->lock_record) < 0) {
    record = NULL;
    r = -ENOMEM;
  }
  if (r == -ENOMEM)
    snprintf (err, errlen, "no memory for %s", st->name);
  if (r == 0 && record)
    r = open_recorded (st, writable, record, spec, err, errlen);
  if (r == 0)
    r = open_named (st, writable, record, spec, err, errlen);
  free (record);
  free (spec);
  if (r < 0)
    return r;
  if (writable && !st->shared &&
      (r = take_lock (st, cfg->lock_record, err, errlen)) < 0)
    return r;
  if ((r = read_size (st)) < 0) {
    snprintf (err, errlen, "%s: reading its size: %s", st->name,
              strerror (-r));
    return r;
  }
  if (rbd_update_watch (st->rbd, &st->watch_handle, on_image_update, st)
      == 0) {
    st->watching = true;
    if (st->locked && st->own_address &&
        pthread_create (&st->checker, NULL, lock_checker, st) == 0)
      __atomic_store_n (&st->checker_running, true, __ATOMIC_RELEASE);
  }
  st->base.info = (struct mloop_store_info) {
    .writable = writable,
    .preferred_block_size = RBD_BLOCK_SIZE,
    .buffer_alignment = 1,
    .direct = true,
    .can_extents = true,
  };
  read_effective_config (st);
  if (!writable)
    start_removal_checker (st);
  return 0;
}

int mloop_rbd_store_module_open (struct mloop_store **out,
                                 const struct mloop_engine_config *cfg,
                                 char *err, size_t errlen);

/* The module's entry point (rbd_load.h). */
int
mloop_rbd_store_module_open (struct mloop_store **out,
                             const struct mloop_engine_config *cfg,
                             char *err, size_t errlen)
{
  struct rbd_store *st = calloc (1, sizeof *st);
  int r;

  if (st == NULL || (st->name = strdup (cfg->path)) == NULL) {
    free (st);
    snprintf (err, errlen, "no memory for %s", cfg->path);
    return -ENOMEM;
  }
  st->base.ops = &rbd_ops;
  st->io_timeout = cfg->io_timeout;
  st->notice = cfg->notice;
  st->count_walks = getenv ("MLOOP_TEST_RBD_WALKS") &&
    *getenv ("MLOOP_TEST_RBD_WALKS");
  pthread_mutex_init (&st->silence_lock, NULL);
  pthread_mutex_init (&st->regain_lock, NULL);
  pthread_mutex_init (&st->check_lock, NULL);
  {
    pthread_condattr_t attr;

    /* The snapshot's check waits on the monotonic clock. */
    pthread_condattr_init (&attr);
    pthread_condattr_setclock (&attr, CLOCK_MONOTONIC);
    pthread_cond_init (&st->check_wanted, &attr);
    pthread_condattr_destroy (&attr);
  }
  r = parse_name (st, cfg, err, errlen);
  if (r == 0 && (cfg->window.offset || cfg->window.sizelimit)) {
    snprintf (err, errlen, "%s: --offset and --sizelimit are for files: "
              "an RBD image is served whole", st->name);
    r = -EINVAL;
  }
  if (r == 0 && cfg->overlay) {
    snprintf (err, errlen, "%s: an overlay over an RBD image is not "
              "supported (an RBD clone is Ceph's own)", st->name);
    r = -ENOTSUP;
  }
  if (r == 0)
    r = connect_cluster (st, err, errlen);
  if (r == 0)
    r = open_image (st, cfg, err, errlen);
  if (r < 0) {
    store_close (&st->base);
    return r;
  }
  *out = &st->base;
  return 0;
}
