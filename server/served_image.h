/* mloop-server — one image served: its engine open, what a handshake
 * announces about it, and the event-loop workers its connections are
 * handed to, round robin.
 *
 * The standalone server (main.c) holds one and feeds it the connections
 * its listener accepts and negotiates; a process that holds many devices
 * holds one per image and may feed it connections that never needed a
 * handshake (a socket pair whose other end goes to the kernel).  The
 * request buffers' budget and the helper threads are the caller's, and
 * may be shared by several images.
 *
 * Order: served_image_open, served_image_start, then connections; at the
 * end served_image_begin_stop (of every image, so their drain deadlines
 * run together), served_image_stop, and served_image_close once the
 * helper threads have finished their jobs.
 */
#ifndef MLOOP_SERVER_SERVED_IMAGE_H
#define MLOOP_SERVER_SERVED_IMAGE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "engine.h"
#include "handshake.h"
#include "session.h"
#include "worker.h"

struct served_image {
  struct mloop_engine engine;
  /* What a handshake announces: the size as opened (the caller reads the
   * engine's size again for each handshake, since a resize changes it),
   * the flags, the block sizes.  The name and TLS are the caller's.
   */
  struct export_info export;
  bool read_only;               /* asked for, or the image is not writable */
  bool discard;                 /* TRIM honoured */
  struct worker **workers;
  unsigned nr_workers;
  unsigned next_worker;
  pthread_mutex_t next_worker_lock;
  /* Its workers' jobs on the helpers, which a process serving many
   * images shares (offload.h).
   */
  struct offload_tenant tenant;
};

/* Warnings while opening (O_DIRECT not supported, an empty export), one
 * line each without the program's name, for the caller to show.
 */
typedef void (*served_image_warn_fn) (const char *line);

/* Opens the image CFG names (CFG->want_write: unless READ_ONLY) and
 * works out what a handshake announces, DISCARD saying whether TRIM is
 * honoured.  Refuses, in one line in ERR, an image that cannot be
 * opened and a system with no room for even one AIO context.  0 or -1.
 */
int served_image_open (struct served_image *s,
                       const struct mloop_engine_config *cfg,
                       bool read_only, bool discard,
                       served_image_warn_fn warn, char *err, size_t errlen);

/* Starts THREADS workers with OPTS (its engine, read_only, discard and
 * max_request are filled in here).  0, or -1 with every worker started
 * stopped again and the reason in ERR.
 */
int served_image_start (struct served_image *s, unsigned threads,
                        const struct worker_options *opts,
                        char *err, size_t errlen);

/* Hands a connection in the transmission phase, and what it negotiated,
 * to the next worker (any thread).
 */
void served_image_add_connection (struct served_image *s, int fd,
                                  const struct session *session);

/* Tells every worker to stop (worker_begin_stop); returns at once. */
void served_image_begin_stop (struct served_image *s);

/* Waits for the workers and frees them. */
void served_image_stop (struct served_image *s);

/* Closes the image. */
void served_image_close (struct served_image *s);

#endif /* MLOOP_SERVER_SERVED_IMAGE_H */
