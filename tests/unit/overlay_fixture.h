/* What the overlay unit tests share: their images, overlays and runtime
 * directory.
 */
#ifndef MLOOP_TESTS_OVERLAY_FIXTURE_H
#define MLOOP_TESTS_OVERLAY_FIXTURE_H

#include "backing.h"
#include "overlay.h"

/* Where unit_make_overlay writes its one cluster. */
#define UNIT_OVERLAY_CLUSTER_AT (3 * MLOOP_OVERLAY_CLUSTER)

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

#endif
