/* Who may lose an RBD image's exclusive lock (engine/rbd_peers.h), as
 * the store decides before taking it again after librbd answered a
 * write EROFS: the store's own watch is left out of the watchers it
 * counts, so a lock the cluster still records for this very server
 * looked like a dead client's, and breaking it would have the cluster
 * refuse (blocklist) the server itself.  Such a holder must be named
 * as this server, never judged dead; others are judged as before.
 * Pure decision, no cluster: well under a millisecond, unit suite.
 */
#include <stddef.h>

#include "rbd_peers.h"
#include "unit.h"

#define US "10.0.0.1:0/1001"
#define OTHER "10.0.0.2:0/2002"
#define THIRD "10.0.0.3:0/3003"

int
main (void)
{
  const char *us_holding[] = { US };
  const char *other_holding[] = { OTHER };
  const char *watching_other[] = { OTHER };
  const char *watching_third[] = { THIRD };
  const char *self_watch[] = { US, NULL };
  const char *self_lock[] = { NULL, US };
  const char *self_unknown[] = { NULL, NULL };
  size_t which = 99;
  enum rbd_peers_verdict v;

  unit_deadline (10);

  /* The record names our watch's address; no other client watches. */
  v = rbd_peers_judge (us_holding, 1, NULL, 0, self_watch, 2, &which);
  CHECK (v == RBD_PEERS_SELF_HOLDER && which == 0,
         "our own lock judged %d, not as ours", (int) v);
  /* ... or the address our lock was recorded under. */
  v = rbd_peers_judge (us_holding, 1, NULL, 0, self_lock, 2, &which);
  CHECK (v == RBD_PEERS_SELF_HOLDER, "our recorded lock judged %d", (int) v);
  /* Ours even with another client watching. */
  v = rbd_peers_judge (us_holding, 1, watching_third, 1, self_watch, 2,
                       &which);
  CHECK (v == RBD_PEERS_SELF_HOLDER, "our lock beside a writer judged %d",
         (int) v);

  /* Others as before: a watching holder lives, ... */
  v = rbd_peers_judge (other_holding, 1, watching_other, 1, self_watch, 2,
                       &which);
  CHECK (v == RBD_PEERS_LIVE_HOLDER && which == 0, "live holder judged %d",
         (int) v);
  /* ... a holder with no watch beside another watcher is not broken, */
  v = rbd_peers_judge (other_holding, 1, watching_third, 1, self_watch, 2,
                       &which);
  CHECK (v == RBD_PEERS_LIVE_WRITER && which == 0, "live writer judged %d",
         (int) v);
  /* ... and one with no watch, alone, is dead. */
  v = rbd_peers_judge (other_holding, 1, NULL, 0, self_watch, 2, &which);
  CHECK (v == RBD_PEERS_NONE_LIVE, "dead holder judged %d", (int) v);
  /* Not knowing our own addresses, a holder is judged by watches alone. */
  v = rbd_peers_judge (us_holding, 1, NULL, 0, self_unknown, 2, &which);
  CHECK (v == RBD_PEERS_NONE_LIVE, "unknown self judged %d", (int) v);
  /* No holder, no watcher: nothing to break. */
  v = rbd_peers_judge (NULL, 0, NULL, 0, self_watch, 2, &which);
  CHECK (v == RBD_PEERS_NONE_LIVE, "free image judged %d", (int) v);
  return 0;
}
