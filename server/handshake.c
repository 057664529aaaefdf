/* mloop-server — the fixed-newstyle NBD handshake. */
#include <endian.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "handshake.h"
#include "nbd_proto.h"
#include "transport.h"

/* The client's stream: the socket, then TLS over it after STARTTLS. */
struct wire {
  int fd;
  struct transport t;
};

static int
wire_recv (struct wire *w, void *buf, size_t n)
{
  return transport_recv_full (&w->t, w->fd, buf, n);
}

static int
wire_send (struct wire *w, const void *buf, size_t n)
{
  return transport_send_full (&w->t, w->fd, buf, n);
}

/* What the options so far have agreed on that the transmission phase
 * depends on.  The export name of the last SET_META_CONTEXT is kept:
 * its selection holds only if GO then names the same export (the spec
 * ties the two; with any name served, they could differ).
 */
struct negotiation {
  bool structured_replies;
  bool base_allocation;         /* selected by the last SET */
  uint32_t meta_name_len;
  char meta_name[NBD_MAX_STRING];
};

/* The largest option payload read and understood.  INFO/GO carry a name
 * (≤ 4096) plus a few info requests, the meta context options a name plus
 * queries (base:allocation is 15 bytes; 1 KiB leaves room for those of
 * other servers' namespaces that clients such as qemu add); anything
 * longer is refused with NBD_REP_ERR_TOO_BIG after its payload is
 * skipped, up to OPTION_SKIP_MAX; beyond that the client is disconnected.
 */
#define OPTION_MAX       (4 + NBD_MAX_STRING + 4 + 1024)
#define OPTION_SKIP_MAX  (1u << 20)

static int
skip (struct wire *w, uint32_t n)
{
  char buf[4096];

  while (n > 0) {
    uint32_t chunk = n < sizeof buf ? n : sizeof buf;

    if (wire_recv (w, buf, chunk) == -1)
      return -1;
    n -= chunk;
  }
  return 0;
}

/* Sends an option reply header followed by LEN bytes of DATA. */
static int
reply (struct wire *w, uint32_t option, uint32_t type, const void *data, uint32_t len)
{
  struct {
    uint64_t magic;
    uint32_t option, type, len;
  } __attribute__((packed)) h = {
    htobe64 (NBD_REP_MAGIC), htobe32 (option), htobe32 (type), htobe32 (len)
  };

  if (wire_send (w, &h, sizeof h) == -1)
    return -1;
  return len ? wire_send (w, data, len) : 0;
}

/* The export's transmission flags as this client gets them: with
 * structured replies, also NBD_FLAG_SEND_DF, since every READ is answered
 * with one chunk anyway (the spec forbids the flag without them).
 */
static uint16_t
session_flags (const struct export_info *x, const struct negotiation *n)
{
  return x->transmission_flags |
    (n->structured_replies ? NBD_FLAG_SEND_DF : 0);
}

static int
reply_info_export (struct wire *w, uint32_t option, const struct export_info *x,
                   const struct negotiation *n)
{
  struct {
    uint16_t type;
    uint64_t size;
    uint16_t flags;
  } __attribute__((packed)) info = {
    htobe16 (NBD_INFO_EXPORT), htobe64 (x->size), htobe16 (session_flags (x, n))
  };

  return reply (w, option, NBD_REP_INFO, &info, sizeof info);
}

static int
reply_info_block_size (struct wire *w, uint32_t option, const struct export_info *x)
{
  struct {
    uint16_t type;
    uint32_t min, preferred, max;
  } __attribute__((packed)) info = {
    htobe16 (NBD_INFO_BLOCK_SIZE), htobe32 (x->min_block),
    htobe32 (x->preferred_block), htobe32 (x->max_block)
  };

  return reply (w, option, NBD_REP_INFO, &info, sizeof info);
}

/* Whether the client's NAME (LEN bytes, not terminated) is ours: any name
 * is, unless the server was given one (--export-name).
 */
static bool
name_matches (const struct export_info *x, const char *name, uint32_t len)
{
  return x->name == NULL ||
    (strlen (x->name) == len && memcmp (x->name, name, len) == 0);
}

/* The session that transmission on export NAME (LEN bytes) gets from
 * what was negotiated.
 */
static void
enter (const struct negotiation *n, const char *name, uint32_t len,
       struct session *out)
{
  out->structured_replies = n->structured_replies;
  out->base_allocation = n->structured_replies && n->base_allocation &&
    n->meta_name_len == len && memcmp (n->meta_name, name, len) == 0;
}

/* The big-endian 32-bit field at P of an option's payload. */
static uint32_t
load_be32 (const char *p)
{
  uint32_t v;

  memcpy (&v, p, 4);
  return be32toh (v);
}

/* NBD_OPT_INFO and NBD_OPT_GO: payload is name length, name, number of
 * info requests, requests.  A name that is not ours gets
 * NBD_REP_ERR_UNKNOWN.  Returns 1 to start transmission (GO, *OUT then
 * set), 0 to go on negotiating, -1 to close.
 */
static int
info_or_go (struct wire *w, uint32_t option, const char *data, uint32_t len,
            const struct export_info *x, const struct negotiation *n,
            struct session *out)
{
  uint32_t name_len;
  uint16_t nr_info;

  if (len < 4)
    goto invalid;
  name_len = load_be32 (data);
  if (name_len > NBD_MAX_STRING || len < 4 + name_len + 2)
    goto invalid;
  memcpy (&nr_info, data + 4 + name_len, 2);
  nr_info = be16toh (nr_info);
  if (len != 4 + name_len + 2 + 2u * nr_info)
    goto invalid;
  if (!name_matches (x, data + 4, name_len))
    return reply (w, option, NBD_REP_ERR_UNKNOWN, NULL, 0) == -1 ? -1 : 0;
  /* NBD_INFO_BLOCK_SIZE is always sent: mloop prefers aligned requests
   * (O_DIRECT), and the spec names such servers as its reason to exist.
   */
  if (reply_info_export (w, option, x, n) == -1 ||
      reply_info_block_size (w, option, x) == -1 ||
      reply (w, option, NBD_REP_ACK, NULL, 0) == -1)
    return -1;
  if (option != NBD_OPT_GO)
    return 0;
  enter (n, data + 4, name_len, out);
  return 1;

 invalid:
  return reply (w, option, NBD_REP_ERR_INVALID, NULL, 0) == -1 ? -1 : 0;
}

/* One NBD_REP_SERVER: our name, or "" (the default export) when any name
 * is served.
 */
static int
list_exports (struct wire *w, uint32_t len, const struct export_info *x)
{
  char entry[4 + NBD_MAX_STRING];
  uint32_t name_len = x->name ? strlen (x->name) : 0;
  uint32_t be_len = htobe32 (name_len);

  if (len != 0)
    return reply (w, NBD_OPT_LIST, NBD_REP_ERR_INVALID, NULL, 0);
  memcpy (entry, &be_len, 4);
  if (name_len)
    memcpy (entry + 4, x->name, name_len);   /* ≤ NBD_MAX_STRING: main.c */
  if (reply (w, NBD_OPT_LIST, NBD_REP_SERVER, entry, 4 + name_len) == -1)
    return -1;
  return reply (w, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
}

/* Whether the query Q (LEN bytes) of a meta context option names
 * base:allocation: exactly, or for LIST also the namespace wildcard
 * "base:" (which SET must ignore).  Anything else is a query mloop has
 * no context for, which the spec says to ignore.
 */
static bool
query_matches (const char *q, uint32_t len, bool list)
{
  const size_t n = strlen (NBD_CONTEXT_BASE_ALLOCATION);

  if (len == n && memcmp (q, NBD_CONTEXT_BASE_ALLOCATION, n) == 0)
    return true;
  return list && len == 5 && memcmp (q, "base:", 5) == 0;
}

/* Parses a meta context option's payload: name length, name, number of
 * queries, then each query as length and string, to the last byte.
 * Returns false when it is malformed; else sets the name and whether the
 * client asked for all contexts (no queries) or base:allocation.
 */
static bool
parse_meta (const char *data, uint32_t len, bool list, const char **name,
            uint32_t *name_len, bool *all, bool *match)
{
  uint32_t pos, nr, i, v;

  if (len < 4)
    return false;
  v = load_be32 (data);
  if (v > NBD_MAX_STRING || len - 4 < v || len - 4 - v < 4)
    return false;
  *name = data + 4;
  *name_len = v;
  pos = 4 + v;
  nr = load_be32 (data + pos);
  pos += 4;
  *all = nr == 0;
  *match = false;
  /* Each query takes at least 4 bytes: the loop ends within LEN. */
  for (i = 0; i < nr; i++) {
    if (len - pos < 4)
      return false;
    v = load_be32 (data + pos);
    pos += 4;
    if (v > len - pos)
      return false;
    if (query_matches (data + pos, v, list))
      *match = true;
    pos += v;
  }
  return pos == len;
}

/* NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT, for the one
 * context mloop has, base:allocation.  Both need structured replies
 * first (the spec: SET SHOULD, LIST MAY be refused without; refusing
 * both keeps the rule simple).  SET replaces the selection even when it
 * fails.  LIST replies with id 0 (reserved), SET with the id
 * BLOCK_STATUS chunks will carry.
 */
static int
meta_context (struct wire *w, uint32_t option, const char *data, uint32_t len,
              const struct export_info *x, struct negotiation *n)
{
  const bool list = option == NBD_OPT_LIST_META_CONTEXT;
  const char *name;
  uint32_t name_len;
  bool all, match;

  if (!list)
    n->base_allocation = false;
  if (!n->structured_replies ||
      !parse_meta (data, len, list, &name, &name_len, &all, &match))
    return reply (w, option, NBD_REP_ERR_INVALID, NULL, 0);
  if (!name_matches (x, name, name_len))
    return reply (w, option, NBD_REP_ERR_UNKNOWN, NULL, 0);
  if (list ? all || match : match) {
    const size_t clen = strlen (NBD_CONTEXT_BASE_ALLOCATION);
    char entry[4 + sizeof NBD_CONTEXT_BASE_ALLOCATION];
    uint32_t id = htobe32 (list ? 0 : SESSION_BASE_ALLOCATION_ID);

    memcpy (entry, &id, 4);
    memcpy (entry + 4, NBD_CONTEXT_BASE_ALLOCATION, clen);
    if (reply (w, option, NBD_REP_META_CONTEXT, entry, 4 + clen) == -1)
      return -1;
    if (!list) {
      n->base_allocation = true;
      n->meta_name_len = name_len;
      memcpy (n->meta_name, name, name_len);
    }
  }
  return reply (w, option, NBD_REP_ACK, NULL, 0);
}

/* NBD_OPT_EXPORT_NAME: no reply header; size and flags, then (unless
 * NO_ZEROES was agreed) 124 bytes of zeroes.
 */
static int
export_name (struct wire *w, const struct export_info *x,
             const struct negotiation *n, bool no_zeroes)
{
  struct {
    uint64_t size;
    uint16_t flags;
    char zeroes[124];
  } __attribute__((packed)) r;

  memset (&r, 0, sizeof r);
  r.size = htobe64 (x->size);
  r.flags = htobe16 (session_flags (x, n));
  return wire_send (w, &r, no_zeroes ? 10 : sizeof r);
}

/* NBD_OPT_STARTTLS, without payload, once: ACK, then the TLS handshake.
 * Returns 0 when TLS is up, 1 when refused (negotiation goes on in
 * plaintext), -1 to close.
 */
static int
start_tls (struct wire *w, uint32_t len, const struct export_info *x)
{
  if (x->tls == HANDSHAKE_TLS_OFF || x->start_tls == NULL)
    return reply (w, NBD_OPT_STARTTLS, NBD_REP_ERR_UNSUP, NULL, 0) == -1
      ? -1 : 1;
  if (len != 0 || w->t.ops)
    return reply (w, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID, NULL, 0) == -1
      ? -1 : 1;
  if (reply (w, NBD_OPT_STARTTLS, NBD_REP_ACK, NULL, 0) == -1)
    return -1;
  return x->start_tls (w->fd, &w->t) == -1 ? -1 : 0;
}

/* The negotiation itself; on 0, the transmission starts on W. */
static int
negotiate (struct wire *w, const struct export_info *x, struct session *out)
{
  struct {
    uint64_t magic, opt_magic;
    uint16_t flags;
  } __attribute__((packed)) greeting = {
    htobe64 (NBD_MAGIC), htobe64 (NBD_IHAVEOPT),
    htobe16 (NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES)
  };
  uint32_t client_flags;
  bool no_zeroes;
  char data[OPTION_MAX];
  struct negotiation n = { .structured_replies = false };

  if (wire_send (w, &greeting, sizeof greeting) == -1 ||
      wire_recv (w, &client_flags, 4) == -1)
    return -1;
  client_flags = be32toh (client_flags);
  if (client_flags & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
    return -1;                  /* the spec: unknown client flags → close */
  no_zeroes = client_flags & NBD_FLAG_C_NO_ZEROES;

  for (;;) {
    struct {
      uint64_t magic;
      uint32_t option, len;
    } __attribute__((packed)) h;
    uint32_t option, len;
    bool tls_required;
    int r;

    if (wire_recv (w, &h, sizeof h) == -1 ||
        be64toh (h.magic) != NBD_IHAVEOPT)
      return -1;
    option = be32toh (h.option);
    len = be32toh (h.len);
    /* --tls require: before TLS, only STARTTLS and ABORT are heard. */
    tls_required = x->tls == HANDSHAKE_TLS_REQUIRE && w->t.ops == NULL &&
      option != NBD_OPT_STARTTLS && option != NBD_OPT_ABORT;
    if (len > OPTION_MAX) {
      /* Bounded: never allocate or read what a client merely declares. */
      if (len > OPTION_SKIP_MAX || skip (w, len) == -1 ||
          option == NBD_OPT_EXPORT_NAME)
        return -1;
      if (option == NBD_OPT_ABORT) {
        /* The spec: a server ignores ABORT's data, and must ack it. */
        reply (w, option, NBD_REP_ACK, NULL, 0);
        return -1;
      }
      if (reply (w, option, tls_required ? NBD_REP_ERR_TLS_REQD
                 : NBD_REP_ERR_TOO_BIG, NULL, 0) == -1)
        return -1;
      continue;
    }
    if (wire_recv (w, data, len) == -1)
      return -1;
    if (tls_required) {
      /* EXPORT_NAME has no error reply: refused by closing. */
      if (option == NBD_OPT_EXPORT_NAME ||
          reply (w, option, NBD_REP_ERR_TLS_REQD, NULL, 0) == -1)
        return -1;
      continue;
    }

    switch (option) {
    case NBD_OPT_EXPORT_NAME:
      /* No error reply exists for this option: a name that is not ours
       * can only be refused by closing.
       */
      if (len > NBD_MAX_STRING || !name_matches (x, data, len))
        return -1;
      enter (&n, data, len, out);
      return export_name (w, x, &n, no_zeroes);
    case NBD_OPT_ABORT:
      reply (w, option, NBD_REP_ACK, NULL, 0);
      return -1;
    case NBD_OPT_STARTTLS:
      r = start_tls (w, len, x);
      if (r == 0) {
        /* The spec: whatever was agreed in plaintext is forgotten
         * (nbdkit CVE-2021-3716).
         */
        n = (struct negotiation) { .structured_replies = false };
        continue;
      }
      break;
    case NBD_OPT_LIST:
      r = list_exports (w, len, x);
      break;
    case NBD_OPT_INFO:
    case NBD_OPT_GO:
      r = info_or_go (w, option, data, len, x, &n, out);
      if (r == 1)
        return 0;
      break;
    case NBD_OPT_STRUCTURED_REPLY:
      /* No payload allowed.  Asking twice is harmless: ACK again. */
      if (len != 0)
        r = reply (w, option, NBD_REP_ERR_INVALID, NULL, 0);
      else {
        n.structured_replies = true;
        r = reply (w, option, NBD_REP_ACK, NULL, 0);
      }
      break;
    case NBD_OPT_LIST_META_CONTEXT:
    case NBD_OPT_SET_META_CONTEXT:
      r = meta_context (w, option, data, len, x, &n);
      break;
    default:
      /* Extended headers, anything newer. */
      r = reply (w, option, NBD_REP_ERR_UNSUP, NULL, 0);
      break;
    }
    if (r == -1)
      return -1;
  }
}

int
mloop_handshake (int fd, const struct export_info *x, struct session *out)
{
  struct wire w = { .fd = fd };

  *out = (struct session) { .structured_replies = false };
  if (negotiate (&w, x, out) == -1) {
    transport_close (&w.t);
    return -1;
  }
  out->transport = w.t;
  return 0;
}
