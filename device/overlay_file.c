/* mloop — an overlay file no device uses.  See overlay_file.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>

#include "device_state.h"
#include "errmsg.h"
#include "fileio.h"
#include "overlay.h"
#include "overlay_file.h"

static bool
same_file (const char *a, const struct stat *b)
{
  struct stat st;

  return a && stat (a, &st) == 0 && st.st_dev == b->st_dev &&
    st.st_ino == b->st_ino;
}

/* Whether device S serves the file of ST as its image (or as the base
 * under its overlay), by identity as attach compares them: a D-Bus
 * caller's own name for the image, a hard link, another mount of it,
 * another node of a block device all count.
 */
static bool
serves_file (const struct mloop_device_state *s, const struct stat *st)
{
  if (s->remote)
    return false;
  if (s->file_dev != 0 || s->file_ino != 0)
    return mloop_state_image_is (s, st);
  return same_file (s->file, st);
}

/* The state lock (device_state.h), under which every device and attach
 * in progress is looked at.  The runtime directory is root's: a caller
 * who is not root cannot look, and is told to run the command as root
 * rather than only what mkdir or open said.
 */
static int
lock_device_states (char *err, size_t errlen)
{
  int lock = mloop_state_lock (err, errlen);

  if (lock == -1 && geteuid () != 0) {
    g_autofree char *why = g_strdup (err);

    mloop_fail (err, errlen, "%s (every device's state is root's: run it "
                "as root)", why);
  }
  return lock;
}

/* Whether a device or an attach in progress uses OVERLAY or, unless NULL,
 * BASE (as its image or the base under its overlay): -1 with ERR naming
 * it, else 0.  Called under the state lock.  Servers started by hand are
 * refused by the locks: the overlay's, and the base's image lock, which the
 * merge takes exclusively (overlay.h).
 */
static int
check_unused (const char *overlay, const struct stat *ov_st,
              const char *base, const struct stat *base_st, char *err,
              size_t errlen)
{
  size_t n[2];
  struct mloop_device_state *lists[2] = {
    mloop_state_list (&n[0]), mloop_state_list_claims (&n[1]),
  };
  int r = 0;

  for (int l = 0; l < 2; l++)
    for (size_t i = 0; i < n[l] && r == 0; i++) {
      const struct mloop_device_state *s = &lists[l][i];
      g_autofree char *dev = l == 0 ? mloop_state_device_path (s)
        : g_strdup ("a device being attached");

      if (same_file (s->overlay, ov_st))
        r = mloop_fail (err, errlen, "overlay %s is in use by %s", overlay,
                        dev);
      else if (base && serves_file (s, base_st))
        r = mloop_fail (err, errlen, "%s, the overlay's base, is in use by "
                        "%s: detach it first", base, dev);
    }
  mloop_state_free_list (lists[0], n[0]);
  mloop_state_free_list (lists[1], n[1]);
  return r;
}

/* The base to merge into: BASE_ARG when given, resolved, else the one
 * the header records, which an overlay made by an older mloop may name
 * relatively to wherever its server ran: then only BASE_ARG will do.
 * FD: the overlay at PATH, open.
 * A recorded path is taken as it is: were its symbolic links followed,
 * the owner of a directory on it (a user whose image root serves) could
 * make one and lead root's commit to a file of their choosing, with
 * their image's ends (version 2) or only its size (version 1, which
 * records nothing else); the merge refuses a path with a link on it,
 * and --base names a base reached through one.
 */
static char *
base_to_write (int fd, const char *path, const char *base_arg, char *err,
               size_t errlen)
{
  g_autofree char *recorded = NULL;
  uint64_t size;
  bool known;
  char *abs;

  if (mloop_overlay_inspect_fd (fd, path, &recorded, &size, &known, NULL,
                                err, errlen) < 0)
    return NULL;
  if (base_arg == NULL && !g_path_is_absolute (recorded)) {
    mloop_fail (err, errlen, "overlay %s names its base only as %s, "
                "relative to where its server ran: name it with --base",
                path, recorded);
    return NULL;
  }
  abs = realpath (base_arg ? base_arg : recorded, NULL);
  if (abs == NULL)
    mloop_fail (err, errlen, "%s, the overlay's base: %s%s",
                base_arg ? base_arg : recorded, strerror (errno),
                base_arg ? "" : " (if it moved, name it with --base)");
  if (abs && base_arg == NULL) {
    free (abs);
    abs = strdup (recorded);
    if (abs == NULL)
      mloop_fail (err, errlen, "out of memory");
  }
  return abs;
}

/* mloop_overlay_file_commit, leaving *BASE to its caller either way. */
static int
commit_into_base (const char *path, const char *base_arg, bool adopt,
                  char **base, char *err, size_t errlen)
{
  struct stat ov_st, base_st;
  bool special;
  int fd, lock, r;

  *base = NULL;
  /* Looked up once: the file whose header names the base, checked
   * unused, is the one merged (mloop_overlay_merge_checked).  Root
   * commits users' overlays, in their directories, and the path may
   * lead to another user's overlay by the time the merge opens it (a
   * symbolic link put in its place, a directory on it swapped): that
   * one would be merged into the base this one's header named, a copy
   * of its own.  Only a regular file, and nothing else opened.
   */
  fd = mloop_open_regular (AT_FDCWD, path, O_RDONLY | O_CLOEXEC |
                           O_NONBLOCK | O_NOCTTY, &special);
  if (fd == -1 && special)
    return mloop_fail (err, errlen, "%s is not an mloop overlay: not a "
                       "regular file", path);
  if (fd == -1 || fstat (fd, &ov_st) == -1) {
    r = mloop_fail (err, errlen, "%s: %s", path, strerror (errno));
    if (fd != -1)
      close (fd);
    return r;
  }
  *base = base_to_write (fd, path, base_arg, err, errlen);
  close (fd);
  if (*base == NULL)
    return -1;
  if (stat (*base, &base_st) == -1)
    return mloop_fail (err, errlen, "%s, the overlay's base: %s", *base,
                       strerror (errno));
  lock = lock_device_states (err, errlen);
  if (lock == -1)
    return -1;
  r = check_unused (path, &ov_st, *base, &base_st, err, errlen);
  /* The base holds it all then, durably: the overlay, adding nothing,
   * goes while the merge still holds its lock.
   */
  if (r == 0 && mloop_overlay_merge_checked (path, &ov_st, *base, adopt,
                                             true, err, errlen) < 0)
    r = -1;
  mloop_state_unlock (lock);
  return r;
}

int
mloop_overlay_file_commit (const char *path, const char *base_arg,
                           bool adopt, char **base, char *err,
                           size_t errlen)
{
  int r = commit_into_base (path, base_arg, adopt, base, err, errlen);

  if (r < 0) {
    free (*base);
    *base = NULL;
  }
  return r;
}

int
mloop_overlay_file_discard (const char *path, char *err, size_t errlen)
{
  g_autofree char *base = NULL, *name = NULL;
  struct stat st, held;
  uint64_t size;
  bool known, special;
  int lock, fd, dir, r;

  if (stat (path, &st) == -1)
    return mloop_fail (err, errlen, "%s: %s", path, strerror (errno));
  /* From here on the overlay's entry in the directory holding it: a
   * directory on the path, the caller's (root's) or not, may be
   * swapped for a symlink meanwhile, and the name unlinked through it
   * would be another directory's file.
   */
  dir = mloop_open_parent (path, &name);
  if (dir == -1)
    return mloop_fail (err, errlen, "the directory of %s: %s", path,
                       strerror (errno));
  /* The entry unlinked is the one named: a symbolic link to the
   * overlay would go, and the overlay, its writes said dropped, stay.
   */
  if (fstatat (dir, name, &held, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK (held.st_mode)) {
    close (dir);
    return mloop_fail (err, errlen, "%s is a symbolic link: name the "
                       "overlay file itself", path);
  }
  /* Never any file but an overlay. */
  if (mloop_overlay_inspect (path, &base, &size, &known, err, errlen) < 0) {
    close (dir);
    return -1;
  }
  lock = lock_device_states (err, errlen);
  if (lock == -1) {
    close (dir);
    return -1;
  }
  r = check_unused (path, &st, NULL, NULL, err, errlen);
  /* Only a regular file, never opened otherwise: what the name holds
   * now may be a FIFO or a device node, put there since the header was
   * read (non-blocking and without a controlling terminal all the same:
   * the state lock is held).
   */
  fd = r == 0 ? mloop_open_regular (dir, name, O_RDONLY | O_CLOEXEC |
                                    O_NONBLOCK | O_NOCTTY, &special) : -1;
  if (r == 0 && fd == -1 && special)
    r = mloop_fail (err, errlen, "%s was replaced while being checked: "
                    "not removed", path);
  else if (r == 0 && fd == -1)
    r = mloop_fail (err, errlen, "cannot open %s: %s", path,
                    strerror (errno));
  /* Only the file checked above: the name may have been given to
   * another file since (a rename over it), which is no overlay.
   */
  if (r == 0 && (fstat (fd, &held) == -1 || !S_ISREG (held.st_mode) ||
                 held.st_dev != st.st_dev || held.st_ino != st.st_ino))
    r = mloop_fail (err, errlen, "%s was replaced while being checked: "
                    "not removed", path);
  /* Removing one name of several would leave the overlay, and its
   * writes said dropped, under the others (hard links).
   */
  if (r == 0 && held.st_nlink > 1)
    r = mloop_fail (err, errlen, "%s has %ju names (hard links): discard "
                    "removes only this one, and the overlay would stay "
                    "under the others; remove them first (not removed)",
                    path, (uintmax_t) held.st_nlink);
  /* A server started by hand holds the overlay's lock. */
  if (r == 0 && flock (fd, LOCK_EX | LOCK_NB) == -1)
    r = mloop_fail (err, errlen, "overlay %s is in use by a server", path);
  if (r == 0 && !mloop_names_file_at (dir, name, fd))
    r = mloop_fail (err, errlen, "%s was replaced while being checked: "
                    "not removed", path);
  /* Read again under the lock, which a commit holds while it writes: a
   * commit that stopped half-way left part of the overlay in the base,
   * which without the rest reads as neither image.  One that finished
   * trades that mark for the spent one before it removes the overlay,
   * so the mark means half-way, or a crash between the base's sync and
   * that trade.
   */
  if (r == 0) {
    g_autofree char *recorded = NULL;
    bool merging = false;

    if (mloop_overlay_inspect_fd (fd, path, &recorded, &size, &known,
                                  &merging, err, errlen) < 0)
      r = -1;
    else if (merging && access (recorded, F_OK) == -1 && errno == ENOENT)
      /* Gone, or moved: the overlay may hold the only copy of the rest
       * of that image, so it stays until the owner says which.
       */
      r = mloop_fail (err, errlen, "a commit of overlay %s into %s stopped "
                      "half-way, and %s is not there now: if it moved, "
                      "finish the commit in it (mloop overlay commit --base "
                      "NEWPATH %s); to give the commit up, mloop overlay "
                      "adopt %s IMAGE, then discard (not removed)", path,
                      recorded, recorded, path, path);
    else if (merging)
      r = mloop_fail (err, errlen, "a commit of overlay %s into %s stopped "
                      "half-way, or finished just before a crash: that "
                      "image may hold part of it; finish it with mloop "
                      "overlay commit (not removed)", path, recorded);
  }
  if (r == 0 && unlinkat (dir, name, 0) == -1)
    r = mloop_fail (err, errlen, "cannot remove %s: %s", path,
                    strerror (errno));
  /* Durably: else a power cut could bring the overlay back, and the
   * next device attached with its name would show the writes dropped.
   */
  if (r == 0 && fsync (dir) == -1)
    r = mloop_fail (err, errlen, "removed %s, but its directory could not "
                    "be synced: %s", path, strerror (errno));
  if (fd != -1)
    close (fd);
  close (dir);
  mloop_state_unlock (lock);
  return r;
}

/* Runs ACT (ARG) on the overlay at PATH, under the state lock, unless a
 * device uses it: by its own name, whose file ACT is given to hold to.
 * Root acts for users, in their directories, and a link there (or one
 * put on the path by the time ACT opens it) could lead to another
 * user's overlay.  VERB names the act in a refusal.  0, or -1 with one
 * line in ERR.
 */
static int
act_on_unused (const char *path, const char *verb,
               int (*act) (const char *path, const struct stat *st,
                           void *arg, char *err, size_t errlen),
               void *arg, char *err, size_t errlen)
{
  struct stat st;
  int lock, r;

  if (lstat (path, &st) == -1)
    return mloop_fail (err, errlen, "%s: %s", path, strerror (errno));
  if (S_ISLNK (st.st_mode))
    return mloop_fail (err, errlen, "%s is a symbolic link: give the "
                       "overlay's own path (not %s)", path, verb);
  lock = lock_device_states (err, errlen);
  if (lock == -1)
    return -1;
  r = check_unused (path, &st, NULL, NULL, err, errlen);
  if (r == 0 && act (path, &st, arg, err, errlen) < 0)
    r = -1;
  mloop_state_unlock (lock);
  return r;
}

static int
adopt_image (const char *path, const struct stat *st, void *image,
             char *err, size_t errlen)
{
  return mloop_overlay_adopt_checked (path, st, image, err, errlen);
}

int
mloop_overlay_file_adopt (const char *path, const char *image, char *err,
                          size_t errlen)
{
  return act_on_unused (path, "adopted", adopt_image, (void *) image, err,
                        errlen);
}

static int
clear_mark (const char *path, const struct stat *st, void *arg, char *err,
            size_t errlen)
{
  (void) arg;
  return mloop_overlay_clear_sync_failed (path, st, err, errlen);
}

int
mloop_overlay_file_clear (const char *path, char *err, size_t errlen)
{
  return act_on_unused (path, "cleared", clear_mark, NULL, err, errlen);
}

int
mloop_overlay_witness_open (const char *path)
{
  bool not_regular;

  if (path == NULL)
    return -1;
  return mloop_open_regular (AT_FDCWD, path, O_RDWR | O_CLOEXEC | O_NOCTTY,
                             &not_regular);
}

int
mloop_overlay_witness_close (int w)
{
  int r;

  if (w == -1)
    return 0;
  r = mloop_overlay_witness_sync (w);
  close (w);
  return r;
}
