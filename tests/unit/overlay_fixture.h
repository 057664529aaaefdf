/* What the overlay commit and discard unit tests share. */
#ifndef MLOOP_TESTS_OVERLAY_FIXTURE_H
#define MLOOP_TESTS_OVERLAY_FIXTURE_H

#include "overlay.h"

/* Where unit_make_overlay writes its one cluster. */
#define UNIT_OVERLAY_CLUSTER_AT (3 * MLOOP_OVERLAY_CLUSTER)

/* Makes the overlay at PATH over BASE_PATH with one cluster of 0x5a
 * written at UNIT_OVERLAY_CLUSTER_AT; fails the test if it cannot.
 */
void unit_make_overlay (const char *base_path, const char *path);

#endif
