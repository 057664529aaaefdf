/* A device's server inside a process that holds many: mloopd.
 *
 * What mloop-server is for one device (its image open on the engine, its
 * workers, a private Unix socket that negotiates connections), without a
 * process of its own: started in milliseconds instead of a program's
 * start, and a thousand of them in one process.  The device side talks
 * to it exactly as to mloop-server (the same socket, the same
 * handshake), so attach, heal, reconnect and `nbd-client -unix` need no
 * second path.
 *
 * Every hosted server of the process shares one buffer budget and one
 * pool of helper threads (offload.h); each has its own workers, so a
 * device whose disk stalls holds up its own requests only.
 *
 * Its connections negotiate on one thread of the server's, one at a
 * time, each within HOSTED_HANDSHAKE_TIMEOUT_S: the socket is in a
 * directory only root may enter (device_state.h), and its clients are
 * mloop's own (attach, the keeper's reconnects) and root's nbd-client.
 */
#ifndef MLOOP_SERVER_HOSTED_SERVER_H
#define MLOOP_SERVER_HOSTED_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define HOSTED_HANDSHAKE_TIMEOUT_S 10

struct hosted_server;

struct hosted_server_config {
  /* The image, window, overlay, RBD options and want_write; its notice
   * callback says the store's changes of state.
   */
  struct mloop_engine_config engine;
  bool read_only;
  unsigned threads;             /* workers; 0: HOSTED_THREADS_DEFAULT */
  const char *socket_path;      /* replaced if a file is there */
  const char *stats_file;       /* request counters, or NULL */
  /* Warnings while opening (O_DIRECT not supported, an empty export). */
  void (*warn) (const char *line);
};

#define HOSTED_THREADS_DEFAULT 4

/* Opens the image, starts its workers and listens on its socket.  NULL
 * with the reason in ERR, one line: nothing is left running then.
 */
struct hosted_server *hosted_server_open (const struct hosted_server_config *c,
                                          char *err, size_t errlen);

/* What a handshake would announce now: size, flags, block sizes. */
void hosted_server_export (struct hosted_server *h, uint64_t *size,
                           uint16_t *flags, uint32_t *min_block,
                           uint32_t *preferred_block, uint32_t *max_block);

/* N connections already in transmission, with no handshake: socket
 * pairs whose one end each the server serves (as a client that
 * negotiated nothing, the kernel's way) and whose other ends are put in
 * FDS, for the caller to hand to the kernel (the one the export's
 * numbers above describe).  0, or -1 with ERR and nothing made.
 */
int hosted_server_pair (struct hosted_server *h, unsigned n, int *fds,
                        char *err, size_t errlen);

/* Reads the image's size again (it was resized): later handshakes
 * announce it and later requests are checked against it.  0, or -1 with
 * ERR (the old size stays).
 */
int hosted_server_reprobe_size (struct hosted_server *h, char *err,
                                size_t errlen);

/* The size a handshake announces now. */
uint64_t hosted_server_size (struct hosted_server *h);

/* Stops listening (the socket is removed), finishes what is in flight
 * and sends the replies (mloop-server's drain on SIGTERM), closes the
 * image.  The connections' peers see them end: the kernel then holds
 * its IO for the next server (dead-connection timeout).
 */
void hosted_server_close (struct hosted_server *h);

#endif /* MLOOP_SERVER_HOSTED_SERVER_H */
