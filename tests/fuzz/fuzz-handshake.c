/* libFuzzer target: mloop-server's fixed-newstyle handshake
 * (server/handshake.c), in process, over a socketpair.
 *
 * Input: one byte choosing the export (bit 0: served under the name
 * "disk" rather than any name; bits 1-2: its size; bit 3: read-only
 * flags) and the client (bit 4: it hangs up as soon as it has sent its
 * bytes, reading nothing), then the bytes a client sends.  A thread plays
 * the client: it sends those bytes, shuts its side down and reads
 * everything the server answers, while mloop_handshake() runs on the
 * other end exactly as in the server, then the answer is checked against
 * the client's bytes.  A client that hung up leaves nothing to check but
 * that the server gave up cleanly.
 *
 * Besides memory and undefined-behaviour errors, the target asserts the
 * rules of the protocol (docs/fuzzing.md): the greeting first; every
 * option answered in order, by replies naming that option, ending with
 * an ACK or an error; export information that is the export's;
 * base:allocation listed or selected only after structured replies, with
 * id 0 for LIST; the session handed to transmission agreeing with the
 * options acknowledged (base:allocation only when the last SET selected
 * it for the name entered); GO or
 * EXPORT_NAME succeeding only for the served name, and the handshake
 * returning 0 exactly when one did, with nothing sent after it.
 */
#include <endian.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "client.h"
#include "handshake.h"
#include "check.h"
#include "nbd_proto.h"

#define NAME "disk"

static const uint64_t sizes[4] = {
  0, 1u << 20, 123456789, UINT64_MAX,
};

/* ------------------------------------------------------------ checks */

struct cursor {
  const uint8_t *p;
  size_t left;
};

static bool
take (struct cursor *c, size_t n, const uint8_t **out)
{
  if (c->left < n)
    return false;
  *out = c->p;
  c->p += n;
  c->left -= n;
  return true;
}

/* Whether an INFO/GO payload asks for NAME; false for a malformed one. */
static bool
asks_for (const uint8_t *data, uint32_t len, const char *name)
{
  uint32_t n;

  if (len < 4)
    return false;
  n = (uint32_t) get_be (data, 4);
  if (n > len - 4)
    return false;
  return name == NULL || (n == strlen (name) && memcmp (data + 4, name, n) == 0);
}

/* The transmission flags a client gets: DF only with structured
 * replies (the spec forbids it without).
 */
static uint16_t
flags_for (const struct export_info *x, bool structured)
{
  return x->transmission_flags | (structured ? NBD_FLAG_SEND_DF : 0);
}

static void
check_info (const uint8_t *p, uint32_t len, const struct export_info *x,
            bool structured)
{
  uint16_t type;

  CHECK (len >= 2);
  type = (uint16_t) get_be (p, 2);
  if (type == NBD_INFO_EXPORT) {
    CHECK (len == 12);
    CHECK (get_be (p + 2, 8) == x->size);
    CHECK (get_be (p + 10, 2) == flags_for (x, structured));
  }
  else if (type == NBD_INFO_BLOCK_SIZE) {
    uint32_t min = (uint32_t) get_be (p + 2, 4);
    uint32_t pref = (uint32_t) get_be (p + 6, 4);
    uint32_t max = (uint32_t) get_be (p + 10, 4);

    CHECK (len == 14);
    CHECK (min == x->min_block && pref == x->preferred_block &&
           max == x->max_block);
  }
  else
    CHECK (type == NBD_INFO_NAME || type == NBD_INFO_DESCRIPTION);
}

/* Walks the client's bytes and the server's answer together. */
/* What the session must say once NAME (LEN bytes) is entered. */
static void
check_session (const struct session *s, bool structured, bool selected,
               const uint8_t *sel_name, uint32_t sel_len,
               const uint8_t *name, uint32_t len)
{
  CHECK (s->structured_replies == structured);
  CHECK (s->base_allocation ==
         (structured && selected && sel_len == len &&
          memcmp (sel_name, name, len) == 0));
}

static void
check (const uint8_t *in, size_t in_len, const uint8_t *out, size_t out_len,
       const struct export_info *x, int result, const struct session *s)
{
  struct cursor cin = { in, in_len }, cout = { out, out_len };
  const uint8_t *p;
  uint32_t client_flags;
  /* What the options acknowledged so far agreed on. */
  bool structured = false, selected = false;
  const uint8_t *sel_name = NULL;
  uint32_t sel_len = 0;

  CHECK (result == 0 || result == -1);
  /* The greeting, sent before anything is read. */
  CHECK (take (&cout, 18, &p));
  CHECK (get_be (p, 8) == NBD_MAGIC && get_be (p + 8, 8) == NBD_IHAVEOPT);
  CHECK (get_be (p + 16, 2) & NBD_FLAG_FIXED_NEWSTYLE);
  if (!take (&cin, 4, &p)) {
    CHECK (result == -1 && cout.left == 0);
    return;
  }
  client_flags = (uint32_t) get_be (p, 4);
  if (client_flags & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) {
    CHECK (result == -1 && cout.left == 0);   /* unknown flags: close */
    return;
  }

  for (;;) {
    const uint8_t *h, *data;
    uint32_t option, len;
    bool complete, acked = false, got_context = false;

    if (cout.left == 0) {
      /* The server stopped answering: it must have given up. */
      CHECK (result == -1);
      return;
    }
    /* The server answered: so it had a whole option header to answer. */
    CHECK (take (&cin, 16, &h));
    CHECK (get_be (h, 8) == NBD_IHAVEOPT);
    option = (uint32_t) get_be (h + 8, 4);
    len = (uint32_t) get_be (h + 12, 4);
    complete = take (&cin, len, &data);

    if (option == NBD_OPT_EXPORT_NAME) {
      /* No reply header: size, flags, and the zeroes unless the client
       * agreed to go without.  Only for our name, and then the end.
       */
      size_t n = (client_flags & NBD_FLAG_C_NO_ZEROES) ? 10 : 134;

      CHECK (complete);
      CHECK (x->name == NULL ||
             (len == strlen (x->name) && memcmp (data, x->name, len) == 0));
      CHECK (take (&cout, n, &p));
      CHECK (get_be (p, 8) == x->size &&
             get_be (p + 8, 2) == flags_for (x, structured));
      for (size_t i = 10; i < n; i++)
        CHECK (p[i] == 0);
      CHECK (cout.left == 0 && result == 0);
      check_session (s, structured, selected, sel_name, sel_len, data, len);
      return;
    }

    /* Replies to this option, up to one that ends it. */
    for (;;) {
      uint32_t type, rlen;

      CHECK (take (&cout, 20, &p));
      CHECK (get_be (p, 8) == NBD_REP_MAGIC);
      CHECK (get_be (p + 8, 4) == option);
      type = (uint32_t) get_be (p + 12, 4);
      rlen = (uint32_t) get_be (p + 16, 4);
      CHECK (rlen <= 4 + NBD_MAX_STRING);
      CHECK (take (&cout, rlen, &p));
      if (type & NBD_REP_ERR (0)) {
        CHECK (rlen <= NBD_MAX_STRING);        /* an optional message */
        break;
      }
      CHECK (complete);         /* only errors for an option not all read */
      if (type == NBD_REP_ACK) {
        CHECK (rlen == 0);
        acked = true;
        break;
      }
      if (type == NBD_REP_SERVER) {
        uint32_t n;

        CHECK (option == NBD_OPT_LIST);
        CHECK (rlen >= 4);
        n = (uint32_t) get_be (p, 4);
        CHECK (n <= rlen - 4);
        if (x->name)
          CHECK (n == strlen (x->name) && memcmp (p + 4, x->name, n) == 0);
        continue;
      }
      if (type == NBD_REP_META_CONTEXT) {
        const size_t n = strlen (NBD_CONTEXT_BASE_ALLOCATION);

        /* The one context, at most once, and only after structured
         * replies; LIST's id is the reserved 0.
         */
        CHECK (option == NBD_OPT_LIST_META_CONTEXT ||
               option == NBD_OPT_SET_META_CONTEXT);
        CHECK (structured && !got_context);
        CHECK (rlen == 4 + n &&
               memcmp (p + 4, NBD_CONTEXT_BASE_ALLOCATION, n) == 0);
        CHECK (get_be (p, 4) == (option == NBD_OPT_LIST_META_CONTEXT
                                 ? 0 : SESSION_BASE_ALLOCATION_ID));
        got_context = true;
        continue;
      }
      CHECK (type == NBD_REP_INFO);
      CHECK (option == NBD_OPT_INFO || option == NBD_OPT_GO);
      check_info (p, rlen, x, structured);
    }

    if (option == NBD_OPT_STRUCTURED_REPLY && acked) {
      CHECK (len == 0);
      structured = true;
    }
    if (acked && (option == NBD_OPT_LIST_META_CONTEXT ||
                  option == NBD_OPT_SET_META_CONTEXT))
      CHECK (structured && asks_for (data, len, x->name));
    if (option == NBD_OPT_SET_META_CONTEXT) {
      /* Each SET replaces the selection, failed or not. */
      selected = acked && got_context;
      if (selected) {
        sel_len = (uint32_t) get_be (data, 4);
        sel_name = data + 4;
      }
    }

    if (acked && (option == NBD_OPT_INFO || option == NBD_OPT_GO))
      CHECK (asks_for (data, len, x->name));
    if (acked && option == NBD_OPT_GO) {
      CHECK (cout.left == 0 && result == 0);  /* transmission begins */
      check_session (s, structured, selected, sel_name, sel_len, data + 4,
                     (uint32_t) get_be (data, 4));
      return;
    }
    if (option == NBD_OPT_ABORT && acked) {
      CHECK (cout.left == 0 && result == -1);
      return;
    }
    CHECK (option != NBD_OPT_STARTTLS || !acked);    /* no TLS here */
  }
}

/* ------------------------------------------------------------ target */

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  struct export_info x = {
    .min_block = 1, .preferred_block = 4096, .max_block = 32u << 20,
  };
  struct fuzz_client c;
  struct session session;
  int sv[2], result;

  if (size < 1)
    return 0;
  x.name = (data[0] & 1) ? NAME : NULL;
  x.size = sizes[(data[0] >> 1) & 3];
  x.transmission_flags = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH |
    NBD_FLAG_SEND_FUA | NBD_FLAG_CAN_MULTI_CONN |
    ((data[0] & 8) ? NBD_FLAG_READ_ONLY
     : NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES);

  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == -1)
    abort ();
  fuzz_client_start (&c, sv[1], data + 1, size - 1,
                     (data[0] & 16) ? FUZZ_CLIENT_HANG_UP : FUZZ_CLIENT_SHUT_WR);
  result = mloop_handshake (sv[0], &x, &session);
  close (sv[0]);                /* the server's side is done either way */
  fuzz_client_join (&c);

  if (c.end == FUZZ_CLIENT_HANG_UP)
    CHECK (result == 0 || result == -1);
  else
    check (c.in, c.in_len, c.out, c.out_len, &x, result, &session);
  free (c.out);
  return 0;
}
