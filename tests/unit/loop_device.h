/* Loop devices for the unit tests that need a block device of their
 * own (an overlay's base on one, a base a loop device holds).
 */
#ifndef MLOOP_TESTS_LOOP_DEVICE_H
#define MLOOP_TESTS_LOOP_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

/* A free loop device: its node into NODE, its number returned.  SKIPs
 * the test without root or loop devices.
 */
int unit_free_loop (char *node, size_t len);

/* Attaches IMAGE to the loop device NODE (read-only, as a read-only
 * loop mount does, when READ_ONLY), detached again when the last
 * descriptor of it closes (the test's, at its exit at the latest).
 * Returns that descriptor; SKIPs the test when it cannot attach.
 */
int unit_loop_attach (const char *node, const char *image, bool read_only);

/* unit_loop_attach with FLAGS (LO_FLAGS_READ_ONLY, LO_FLAGS_PARTSCAN)
 * beside autoclear.
 */
int unit_loop_attach_flags (const char *node, const char *image,
                            unsigned flags);

#endif /* MLOOP_TESTS_LOOP_DEVICE_H */
