/* An image file for the engine's unit tests, opened with O_DIRECT.
 *
 * The file lives in a private directory on /var/tmp (a disk filesystem:
 * /tmp may be a tmpfs, which refuses O_DIRECT), removed when the test
 * exits.  Where O_DIRECT is refused the test is skipped: the
 * read-modify-write under test exists only for it.
 */
#ifndef MLOOP_TESTS_DIRECT_IMAGE_H
#define MLOOP_TESTS_DIRECT_IMAGE_H

#include <stdint.h>

#include "engine.h"
#include "file_store.h"

/* Writes SIZE bytes of CONTENTS to a new image and opens it writable
 * through E with O_DIRECT.  Returns the image's path.
 */
const char *direct_image_open (struct mloop_engine *e,
                               const unsigned char *contents, size_t size);

/* The file store under E, for tests of its internals (unaligned.c). */
struct mloop_file_store *direct_image_store (struct mloop_engine *e);

/* The image's bytes as they are on disk, read on a descriptor of its
 * own, with O_DIRECT so that no page cache stands between.  Into BUF,
 * SIZE bytes (a multiple of 64 KiB).
 */
void direct_image_read (const char *path, unsigned char *buf, size_t size);

#endif /* MLOOP_TESTS_DIRECT_IMAGE_H */
