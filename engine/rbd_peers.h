/* mloop — who may lose an RBD image's exclusive lock (rbd_store.c).
 *
 * Before the store takes an image's lock it tells the lock's holders
 * (the cluster's lock record) that live from those that are dead, by
 * the image's watchers: a live client watches the image's header.  The
 * decision alone is here, on addresses as librbd spells them, so that
 * it can be tested without a cluster; rbd_store.c asks librbd for the
 * addresses and acts on the verdict.
 */
#ifndef MLOOP_RBD_PEERS_H
#define MLOOP_RBD_PEERS_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

enum rbd_peers_verdict {
  RBD_PEERS_NONE_LIVE,          /* every holder is dead: break their locks */
  RBD_PEERS_LIVE_HOLDER,        /* HOLDERS[*which] watches: it lives */
  RBD_PEERS_LIVE_WRITER,        /* WATCHERS[*which] has the image open */
  RBD_PEERS_SELF_HOLDER,        /* HOLDERS[*which] is this very client */
};

/* Whether ADDRESS is one of SELF's N addresses (NULLs not counted). */
static inline bool
rbd_peers_is_self (const char *address, const char *const *self, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (self[i] && strcmp (address, self[i]) == 0)
      return true;
  return false;
}

/* The verdict on the lock's N_HOLDERS HOLDERS, given the image's
 * N_WATCHERS other WATCHERS (our own watch left out, and those of the
 * device's recorded servers) and the N_SELF addresses this client is
 * known by (its watch's, the one its lock was recorded under).  Our
 * own watch is not among WATCHERS, so a holder that is us would look
 * dead: yet the cluster can record us while librbd believes it holds
 * nothing (its release of the lock failed to reach the cluster, or it
 * could not say who owns it), and breaking that lock would have the
 * cluster refuse this very client (break_lock blocklists the holder),
 * failing every request it serves.  So that holder is named instead,
 * and never broken (the store lets that lock go as its own client's,
 * by its cookie).  *WHICH: the index the verdict names.
 */
static inline enum rbd_peers_verdict
rbd_peers_judge (const char *const *holders, size_t n_holders,
                 const char *const *watchers, size_t n_watchers,
                 const char *const *self, size_t n_self, size_t *which)
{
  *which = 0;
  for (size_t i = 0; i < n_holders; i++) {
    *which = i;
    if (rbd_peers_is_self (holders[i], self, n_self))
      return RBD_PEERS_SELF_HOLDER;
    for (size_t j = 0; j < n_watchers; j++)
      if (strcmp (holders[i], watchers[j]) == 0)
        return RBD_PEERS_LIVE_HOLDER;
  }
  *which = 0;
  /* Any other watcher has the image open for writing, lock or not, and
   * would fail its next write once we hold the lock, even where the
   * holder is dead.
   */
  return n_watchers > 0 ? RBD_PEERS_LIVE_WRITER : RBD_PEERS_NONE_LIVE;
}

#endif
