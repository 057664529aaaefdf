/* The fuzz targets' client: a thread that sends the fuzz input on one end
 * of a socketpair and reads everything the server side answers.
 */
#ifndef MLOOP_FUZZ_CLIENT_H
#define MLOOP_FUZZ_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the client does once it has sent everything. */
enum fuzz_client_end {
  FUZZ_CLIENT_SHUT_WR,          /* shut its sending side, read on */
  FUZZ_CLIENT_HANG_UP,          /* go away, read nothing */
  FUZZ_CLIENT_STAY_OPEN,        /* keep both sides open, read on: the
                                   server alone ends the connection */
};

struct fuzz_client {
  int fd;                       /* the client's end */
  const uint8_t *in;            /* what the client sends */
  size_t in_len;
  enum fuzz_client_end end;
  uint8_t *out;                 /* what the server answered (malloc'd) */
  size_t out_len, out_cap;
  pthread_t thread;
};

/* Starts the client on FD: it sends IN, then does what END says, and
 * (unless it hung up) reads until the server closes.  Aborts on failure:
 * a harness problem, not a finding.
 */
void fuzz_client_start (struct fuzz_client *c, int fd, const uint8_t *in,
                        size_t in_len, enum fuzz_client_end end);

/* Waits for the client to finish; c->out holds the answer.  Closes FD. */
void fuzz_client_join (struct fuzz_client *c);

#endif /* MLOOP_FUZZ_CLIENT_H */
