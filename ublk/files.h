/* The files mloop-ublk leaves for whoever started it (mloop attach):
 * the device file and the pid file, each written whole or not at all. */
#ifndef MLOOP_UBLK_FILES_H
#define MLOOP_UBLK_FILES_H

#include <stddef.h>

/* Writes TEXT into PATH atomically: a temporary file next to it, then
 * rename, so a reader sees no file or all of it.  0, or -1 with a
 * one-line reason naming PATH in ERR (no temporary file left). */
int ublk_write_file_atomic (const char *path, const char *text,
                            char *err, size_t errlen);

#endif
