/* A scripted NBD client for mloop_handshake() (server/handshake.c).
 *
 * Thread model: none.  The client's bytes are written whole into one end
 * of a socketpair and its sending side shut down; then the handshake runs
 * on the other end in the calling thread, and what it sent back is read
 * afterwards.  Both directions fit the socket buffers (a few KiB each),
 * so nobody waits for the other, and a server waiting for more than the
 * script holds sees EOF instead of hanging.
 */
#ifndef MLOOP_TESTS_HANDSHAKE_CLIENT_H
#define MLOOP_TESTS_HANDSHAKE_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "handshake.h"

/* A growing byte string: what the client sends, what the server said. */
struct bytes {
  uint8_t *data;
  size_t len, cap;
};

void put_be (struct bytes *b, uint64_t v, int n);
void put_data (struct bytes *b, const void *p, size_t n);
/* An option header declaring LEN bytes of payload, without them. */
void put_option_header (struct bytes *b, uint32_t option, uint32_t len);
/* An option header, then LEN bytes of DATA (zeroes when DATA is NULL). */
void put_option (struct bytes *b, uint32_t option, const void *data,
                 uint32_t len);
/* NBD_OPT_GO (or INFO) for NAME, asking for no particular information. */
void put_go (struct bytes *b, uint32_t option, const char *name);

/* Reading the answer: every getter fails the test when it runs short. */
struct reader {
  const uint8_t *p;
  size_t left;
  const char *what;             /* the case, for failure messages */
};

/* A plain export: 1 MiB, served as "disk". */
extern const struct export_info plain_disk;

/* What the last handshake() agreed on (valid when it returned 0). */
extern struct session handshake_session;

/* Runs mloop_handshake() for export X against the client's bytes CLIENT
 * (client flags first) and checks that it returned RESULT (0: into
 * transmission, -1: closed) and that its answer, kept in *ANSWER, starts
 * with the greeting.  Returns a reader on the rest; WHAT names the case.
 */
struct reader handshake (const struct export_info *x,
                         const struct bytes *client, struct bytes *answer,
                         int result, const char *what);

uint64_t get_be (struct reader *r, int n);
/* The next option reply, which must answer OPTION and be of TYPE; its
 * payload is returned (LEN bytes, *LEN set) and skipped.
 */
const uint8_t *expect_reply (struct reader *r, uint32_t option,
                             uint32_t type, uint32_t *len);
/* Nothing more was sent. */
void expect_end (struct reader *r);
/* The replies accepting a GO (two INFOs, the ACK), and nothing after. */
void expect_go_accepted (struct reader *r);

void bytes_free (struct bytes *b);

#endif /* MLOOP_TESTS_HANDSHAKE_CLIENT_H */
