/* What the overlay unit tests share: their images, overlays and runtime
 * directory.
 */
#ifndef MLOOP_TESTS_OVERLAY_FIXTURE_H
#define MLOOP_TESTS_OVERLAY_FIXTURE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "backing.h"
#include "overlay.h"

/* Where unit_make_overlay writes its one cluster. */
#define UNIT_OVERLAY_CLUSTER_AT (3 * MLOOP_OVERLAY_CLUSTER)

/* Where an overlay's header keeps what it recorded of its base: st_dev,
 * st_ino and birth time (docs/design.md, "The format"; little-endian,
 * as these tests run).
 */
#define UNIT_HDR_BASE_DEV 48
#define UNIT_HDR_BASE_INO 56
#define UNIT_HDR_BASE_BIRTH 4088

/* Makes DIR/run and names it MLOOP_RUNTIME_DIR: the state lock and the
 * records that discard and commit take there are then the test's own,
 * never those of the user running it (nor shared between tests run at
 * once).  Fails the test if it cannot.
 */
void unit_runtime_dir (const char *dir);

/* Opens the image at BASE_PATH into BASE (buffered, for reading) and
 * the overlay at PATH over it into OV, making the overlay if missing,
 * as a server does; fails the test if either cannot be opened.
 */
void unit_open_overlay (struct mloop_backing *base, struct mloop_overlay *ov,
                        const char *base_path, const char *path);

/* Makes the overlay at PATH over BASE_PATH with nothing written in it;
 * fails the test if it cannot.
 */
void unit_make_empty_overlay (const char *base_path, const char *path);

/* Makes the overlay at PATH over BASE_PATH with one cluster of 0x5a
 * written at UNIT_OVERLAY_CLUSTER_AT; fails the test if it cannot.
 */
void unit_make_overlay (const char *base_path, const char *path);

/* Makes the image at PATH, SIZE bytes, with TAG written at its start (so
 * that images made alike still differ where a test wants them to);
 * fails the test if it cannot.
 */
void unit_make_tagged_image (const char *path, uint64_t size, const char *tag);

/* The byte at AT in the file at PATH. */
unsigned char unit_byte_at (const char *path, off_t at);

/* The 64-bit word at AT in the file at PATH (a header field), and
 * writing one there.
 */
uint64_t unit_get_u64 (const char *path, off_t at);
void unit_put_u64 (const char *path, off_t at, uint64_t value);

/* Writes one cluster of 0x5a at AT through the overlay at PATH over
 * BASE_PATH, as a server does; fails the test if it cannot.
 */
void unit_write_cluster (const char *base_path, const char *path, uint64_t at);

/* Opens the overlay at PATH over BASE_PATH with CHECK and closes it:
 * 0, or the negative errno of the refusal, its reason in ERR.
 */
int unit_try_open_overlay (const char *base_path, const char *path,
                           enum mloop_overlay_base_check check, char *err,
                           size_t errlen);

/* The same over WINDOW of BASE_PATH (NULL: all of it). */
int unit_try_open_window (const char *base_path,
                          const struct mloop_window *window, const char *path,
                          enum mloop_overlay_base_check check, char *err,
                          size_t errlen);

/* The header of the overlay at PATH as the next mount finds it: its
 * base's file system under another device number.
 */
void unit_renumber_base_device (const char *path);

/* Marks the overlay at PATH as a commit into BASE_PATH does before its
 * first write.
 */
void unit_mark_merging (const char *base_path, const char *path);

/* Leaves the overlay at PATH and BASE_PATH (a file or a device node) as
 * a commit stopped half-way does: the base opened with CHECK (a merge's:
 * MLOOP_OVERLAY_MERGE_BASE or MLOOP_OVERLAY_MERGE_ANY_BASE), the overlay
 * marked, and one cluster of 0x5a written into the base at
 * UNIT_OVERLAY_CLUSTER_AT and synced.
 */
void unit_stop_commit (const char *path, const char *base_path,
                       enum mloop_overlay_base_check check);

/* Makes the overlay at PATH a version 1 one recording its base as NAME,
 * as an older mloop wrote it: the path up to the header's end.
 */
void unit_make_version_1 (const char *path, const char *name);

/* Copies the file at FROM to a new file TO, byte for byte. */
void unit_copy_file (const char *from, const char *to);

/* Whether the overlay at PATH records BASE_PATH with the merge's mark. */
bool unit_still_marks (const char *path, const char *base_path);

/* Commits the overlay at PATH into BASE_PATH (removing it) in a child
 * process that first runs ENTER (ARG): to become another user, to leave
 * sysfs behind.  ENTER returns 0 to go on, else the child's exit status
 * (3 or more).  Prints the outcome.  Returns 0 committed, 1 refused with
 * an error holding NEEDLE, 2 refused otherwise, or ENTER's status.
 */
int unit_commit_in_child (const char *path, const char *base_path,
                          int (*enter) (void *arg), void *arg,
                          const char *needle);

#endif
