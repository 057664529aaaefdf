/* A supervisor's witness of a copy-on-write overlay: the failed sync a
 * killed server took with it, still told.
 *
 * The kernel tells a failed writeback once to each open file that has
 * not taken it yet, and to no file opened after one took it.  A server
 * killed while a sync that then failed was under way (a stop's SIGKILL
 * on a stalled disk, the OOM killer) takes that report with it before
 * it can mark the overlay's header, and the next server, opened after,
 * is told nothing: its FLUSH would succeed over the lost writes.  The
 * witness, a descriptor of the overlay its supervisor opened while the
 * server served and syncs only after the server's exit, is still told:
 * it marks the header (mloop_overlay_witness_sync), so every later
 * server fails FLUSH until `mloop overlay clear`.
 *
 * Only where the supervisor is another process than the server: a
 * server inside mloopd dies with its witness.
 */
#ifndef MLOOP_SUPERVISOR_OVERLAY_WITNESS_H
#define MLOOP_SUPERVISOR_OVERLAY_WITNESS_H

#include <stdbool.h>
#include <stdio.h>

#include <glib.h>

struct overlay_witness;

/* The witness of OVERLAY, once a server has made it; what goes wrong is
 * said to LOG.  NULL (nothing to witness) when OVERLAY is NULL or it
 * cannot be opened.
 */
struct overlay_witness *overlay_witness_open (const char *overlay,
                                              FILE *log);

/* Before a server opens the overlay after another's exit (or a start's
 * failure): the witness's sync, on a thread of its own (a
 * stalled disk must not hold up the other devices of mloopd), then
 * THEN (DATA) from the calling thread's main context, once, whatever
 * came of it.  The next server must not open the overlay before THEN:
 * the mark is written by then.  False, and no THEN, when W is NULL or
 * no thread could be started (the sync then ran on the caller's, and
 * the caller goes on at once).  One check at a time.
 */
bool overlay_witness_check (struct overlay_witness *w, GSourceFunc then,
                            gpointer data);

/* Whether a check of W is under way (W NULL: no). */
bool overlay_witness_busy (const struct overlay_witness *w);

/* At a stop, once the server is gone: the witness's last sync, here and
 * now (as long as the disk stalls), so it is done before the process
 * may end.  W may be NULL.
 */
void overlay_witness_check_now (struct overlay_witness *w);

/* Closes W (NULL: nothing).  A check under way finishes first, and its
 * THEN is dropped.
 */
void overlay_witness_free (struct overlay_witness *w);

#endif /* MLOOP_SUPERVISOR_OVERLAY_WITNESS_H */
