/* mloopd — what it keeps of a device, on disk: the request that began
 * keeping it, in the device's directory (MLOOP_DIR_KEEP), so that the
 * service started after this one (a crash, an upgrade) takes every
 * device over with the same server command, instead of forgetting them.
 * Paths (image, overlay, remote) are kept in base64 too (KEY64), since a
 * path need not be UTF-8; a record without them (an older mloopd's) is
 * read from the plain keys.
 */
#ifndef MLOOP_KEEP_RECORD_H
#define MLOOP_KEEP_RECORD_H

#include <stddef.h>

#include "server_process.h"

/* SPEC's server (kind, image, window, overlay, threads, read_only,
 * io_timeout) into DIR's record, durably replacing any.  0, or -1 with
 * ERR.
 */
int keep_record_save (const char *dir, const struct mloop_server_spec *spec,
                      char *err, size_t errlen);

/* A remote export's device: its URI into DIR's record, as
 * keep_record_save.
 */
int keep_record_save_remote (const char *dir, const char *uri, char *err,
                             size_t errlen);

/* DIR's record: a local server's into *SPEC, whose strings (image,
 * overlay) are to g_free, or a remote export's URI into *REMOTE (to
 * g_free; NULL for a local server).  0, or -1 with ERR (no record:
 * ENOENT in errno).
 */
int keep_record_load (const char *dir, struct mloop_server_spec *spec,
                      char **remote, char *err, size_t errlen);

void keep_record_remove (const char *dir);

#endif /* MLOOP_KEEP_RECORD_H */
