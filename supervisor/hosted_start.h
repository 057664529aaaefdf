/* A hosted server (server/hosted_server.h) opened without holding up
 * the main loop.
 *
 * Opening an image can take long: an RBD image's cluster slow to
 * answer, an image on a stalled disk.  mloopd keeps every device on one
 * main loop, so the open runs on a thread of its own and its outcome
 * comes back on the main context it was begun from, as a process
 * server's start does (server_start.h).
 */
#ifndef MLOOP_SUPERVISOR_HOSTED_START_H
#define MLOOP_SUPERVISOR_HOSTED_START_H

#include "hosted_server.h"
#include "server_process.h"

struct hosted_start;

/* Called on the starting main context: H, the server listening, or NULL
 * with ERR saying why it did not open.
 */
typedef void (*hosted_started_fn) (struct hosted_server *h, const char *err,
                                   void *data);

/* Opens SPEC's image (copied) as a hosted server and calls DONE. */
struct hosted_start *hosted_start_begin (const struct mloop_server_spec *spec,
                                         hosted_started_fn done, void *data);

/* The caller no longer wants the outcome: DONE is not called, and a
 * server that opens anyway is closed.
 */
void hosted_start_abandon (struct hosted_start *s);

#endif /* MLOOP_SUPERVISOR_HOSTED_START_H */
