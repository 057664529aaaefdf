/* The messages of mloop's control socket: what the mloop command asks
 * the resident service, and its answers.
 *
 * A message is one datagram of a SOCK_SEQPACKET Unix socket: fields
 * "key=value", each ended by a NUL, at most MLOOP_CONTROL_MAX_BYTES in
 * all, with at most MLOOP_CONTROL_MAX_FDS descriptors passed along it
 * (SCM_RIGHTS: the image a caller opened, an overlay, a device's
 * connections: up to 16).  Keys are short
 * lower-case words, each at most once; a value is any bytes but NUL
 * (a path is bytes, not text).
 *
 * Why not D-Bus, varlink or JSON: the command must start quickly on the
 * attach path, so it loads neither gio nor json-glib there, and the
 * service must read every request from a caller it does not trust with
 * bounds it can state in one line each.  A datagram per message needs
 * no framing, and the kernel says who sent it (SO_PEERCRED).  libc only.
 */
#ifndef MLOOP_CONTROL_MESSAGE_H
#define MLOOP_CONTROL_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define MLOOP_CONTROL_MAX_BYTES 65536
#define MLOOP_CONTROL_MAX_FIELDS 64
#define MLOOP_CONTROL_MAX_KEY 32
#define MLOOP_CONTROL_MAX_FDS 16

/* A message being written: add fields, then send it. */
struct mloop_control_out {
  char buf[MLOOP_CONTROL_MAX_BYTES];
  size_t len;
  size_t n_fields;
  bool too_big;               /* a field did not fit: sending fails */
};

/* A message received and checked. */
struct mloop_control_in {
  char buf[MLOOP_CONTROL_MAX_BYTES + 1];
  size_t n_fields;
  const char *key[MLOOP_CONTROL_MAX_FIELDS];
  const char *value[MLOOP_CONTROL_MAX_FIELDS];
  int fds[MLOOP_CONTROL_MAX_FDS]; /* -1 once taken */
  size_t n_fds;
};

void mloop_control_out_init (struct mloop_control_out *out);

/* Adds KEY=VALUE.  False (and the message marked too big) when KEY is
 * not a valid key, is already there, or the field does not fit.
 */
bool mloop_control_add (struct mloop_control_out *out, const char *key,
                        const char *value);

/* Sends OUT with the N_FDS descriptors FDS (kept open here) on SOCK.
 * 0, or -1 with errno: EMSGSIZE for a message marked too big, EINVAL
 * for more than MLOOP_CONTROL_MAX_FDS descriptors.
 */
int mloop_control_send (int sock, const struct mloop_control_out *out,
                        const int *fds, size_t n_fds);

/* Receives one message from SOCK into IN.  1 for a message, 0 when the
 * peer has closed, -1 with a one-line reason in ERR for a message
 * refused (its descriptors closed, none left open here) or a failed
 * receive.  The descriptors arrive close-on-exec.
 */
int mloop_control_recv (int sock, struct mloop_control_in *in, char *err,
                        size_t errlen);

/* Checks the LEN bytes at IN->buf as a message and indexes its fields;
 * what mloop_control_recv does once the datagram is in.  False with
 * ERR.  For the fuzzer and the tests.
 */
bool mloop_control_parse (struct mloop_control_in *in, size_t len, char *err,
                          size_t errlen);

/* The value of KEY in IN, or NULL. */
const char *mloop_control_get (const struct mloop_control_in *in,
                               const char *key);

/* Takes the I'th descriptor out of IN (the caller closes it); -1 when
 * there is none.
 */
int mloop_control_take_fd (struct mloop_control_in *in, size_t i);

/* Closes the descriptors of IN not taken. */
void mloop_control_in_clear (struct mloop_control_in *in);

/* The process at the other end of SOCK, as the kernel recorded it at
 * connect.  0, or -1 with errno.
 */
int mloop_control_peer (int sock, struct ucred *cred);

#endif /* MLOOP_CONTROL_MESSAGE_H */
