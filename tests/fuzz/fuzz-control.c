/* libFuzzer target: the control socket's message parser
 * (control/message.c), which reads every request a local caller sends
 * the resident service.
 *
 * Input: one datagram's bytes.  Besides memory and undefined-behaviour
 * errors, the target asserts what a taken message promises: every key
 * is [a-z0-9-]{1,32} and appears once, every value lies inside the
 * datagram, the field count is within bounds and each field is found by
 * its key.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "check.h"
#include "message.h"

static struct mloop_control_in in;

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  char err[256];

  if (size > MLOOP_CONTROL_MAX_BYTES)
    return 0;
  memcpy (in.buf, data, size);
  in.n_fds = 0;
  if (!mloop_control_parse (&in, size, err, sizeof err)) {
    CHECK (err[0] != '\0');
    return 0;
  }
  CHECK (size > 0 && in.buf[size - 1] == '\0');
  CHECK (in.n_fields >= 1 && in.n_fields <= MLOOP_CONTROL_MAX_FIELDS);
  for (size_t i = 0; i < in.n_fields; i++) {
    size_t klen = strlen (in.key[i]);

    CHECK (klen >= 1 && klen <= MLOOP_CONTROL_MAX_KEY);
    CHECK (strspn (in.key[i], "abcdefghijklmnopqrstuvwxyz0123456789-") == klen);
    CHECK (in.value[i] > in.buf && in.value[i] < in.buf + size);
    CHECK (in.value[i] + strlen (in.value[i]) < in.buf + size);
    CHECK (mloop_control_get (&in, in.key[i]) == in.value[i]);
  }
  return 0;
}
