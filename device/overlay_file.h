/* mloop — an overlay file no device uses: `mloop overlay commit` folds
 * it into its base, `mloop overlay discard` drops it.
 */
#ifndef MLOOP_OVERLAY_FILE_H
#define MLOOP_OVERLAY_FILE_H

#include <stdbool.h>
#include <stddef.h>

/* Copies what the overlay at PATH holds into the base image it was made
 * for (the path its header records, or BASE_ARG when not NULL), makes
 * the base durable, then removes the overlay.  Refused for an image
 * that is not its base unless ADOPT, while a device (or an attach in
 * progress) uses the overlay or the base (compared by device and
 * inode), while any server holds the base (its image lock), and for an
 * overlay made for a window of its base.  Holds the state lock
 * throughout, so no attach takes either meanwhile.  *BASE is the base
 * written (to free), NULL after a failure.  0, or -1 with one line in
 * ERR.
 */
int mloop_overlay_file_commit (const char *path, const char *base_arg,
                               bool adopt, char **base, char *err,
                               size_t errlen);

/* Removes the overlay at PATH, its writes lost.  Refused while a device
 * or a server uses it, for a file that is not an mloop overlay, and
 * for one a commit stopped half-way (the base holds part of it).
 * 0, or -1 with one line in ERR.
 */
int mloop_overlay_file_discard (const char *path, char *err, size_t errlen);

/* Records IMAGE as the base of the overlay at PATH though it was made
 * for another image of that size.  Refused while a device or a server
 * uses the overlay.  0, or -1 with one line in ERR.
 */
int mloop_overlay_file_adopt (const char *path, const char *image,
                              char *err, size_t errlen);

/* Clears the mark a failed sync left on the overlay at PATH, which
 * makes every server of it fail FLUSH: its owner's word that the data
 * on it was checked since.  Refused while a device or a server uses the
 * overlay.  0, or -1 with one line in ERR.
 */
int mloop_overlay_file_clear (const char *path, char *err, size_t errlen);

/* A witness of the overlay at PATH, for whoever stops the processes
 * that write it: a descriptor opened before they are told to stop and
 * closed by mloop_overlay_witness_close once they are gone.  A server
 * killed inside a sync that then failed took the kernel's report with
 * it; the witness, open since before, is told too, and marks the
 * header (engine/overlay.h, mloop_overlay_witness_sync).  -1 (nothing
 * to witness) when PATH is NULL or names no regular file it can open.
 */
int mloop_overlay_witness_open (const char *path);

/* Syncs witness W (marking the overlay if that fails) and closes it;
 * -1 is none.  0, or the sync's negative errno.
 */
int mloop_overlay_witness_close (int w);

#endif /* MLOOP_OVERLAY_FILE_H */
