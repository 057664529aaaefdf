/* mloop — the client side of the NBD handshake. */
#include <endian.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "nbd_client.h"
#include "nbd_proto.h"
#include "sockio.h"

/* Option replies we read in full; longer ones are skipped. */
#define REPLY_MAX 4096

/* The server broke the protocol: says how in ERR, errno EPROTO, -1. */
static int __attribute__((format (printf, 3, 4)))
protocol_error (char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (err, errlen, fmt, ap);
  va_end (ap);
  errno = EPROTO;
  return -1;
}

static int
send_option (int fd, uint32_t option, const void *data, uint32_t len)
{
  struct {
    uint64_t magic;
    uint32_t option, len;
  } __attribute__((packed)) h = {
    htobe64 (NBD_IHAVEOPT), htobe32 (option), htobe32 (len)
  };

  if (mloop_send_full (fd, &h, sizeof h) == -1)
    return -1;
  return len ? mloop_send_full (fd, data, len) : 0;
}

/* Handles one NBD_REP_INFO payload. */
static void
take_info (const unsigned char *p, uint32_t len, struct mloop_nbd_export *x)
{
  uint16_t type;

  if (len < 2)
    return;
  memcpy (&type, p, 2);
  type = be16toh (type);
  if (type == NBD_INFO_EXPORT && len >= 12) {
    memcpy (&x->size, p + 2, 8);
    x->size = be64toh (x->size);
    memcpy (&x->flags, p + 10, 2);
    x->flags = be16toh (x->flags);
  }
  else if (type == NBD_INFO_BLOCK_SIZE && len >= 14) {
    memcpy (&x->min_block, p + 2, 4);
    memcpy (&x->preferred_block, p + 6, 4);
    memcpy (&x->max_block, p + 10, 4);
    x->min_block = be32toh (x->min_block);
    x->preferred_block = be32toh (x->preferred_block);
    x->max_block = be32toh (x->max_block);
  }
}

/* NBD_OPT_GO.  Returns 1 when done, 0 when the server lacks GO (try
 * EXPORT_NAME), -1 on failure.
 */
static int
go (int fd, const char *name, struct mloop_nbd_export *x, char *err,
    size_t errlen)
{
  unsigned char buf[REPLY_MAX];
  uint32_t name_len = (uint32_t) strlen (name), nl = htobe32 (name_len);
  uint16_t one = htobe16 (1), want = htobe16 (NBD_INFO_BLOCK_SIZE);
  bool have_export = false;

  if (name_len > NBD_MAX_STRING) {
    snprintf (err, errlen, "export name longer than %d bytes",
              NBD_MAX_STRING);
    errno = EINVAL;
    return -1;
  }
  memcpy (buf, &nl, 4);
  memcpy (buf + 4, name, name_len);
  memcpy (buf + 4 + name_len, &one, 2);
  memcpy (buf + 6 + name_len, &want, 2);
  if (send_option (fd, NBD_OPT_GO, buf, name_len + 8) == -1)
    goto io_error;

  for (;;) {
    struct {
      uint64_t magic;
      uint32_t option, type, len;
    } __attribute__((packed)) r;
    uint32_t type, len;

    if (mloop_recv_full (fd, &r, sizeof r) == -1)
      goto io_error;
    type = be32toh (r.type);
    len = be32toh (r.len);
    if (be64toh (r.magic) != NBD_REP_MAGIC ||
        be32toh (r.option) != NBD_OPT_GO) {
      return protocol_error (err, errlen,
                             "bad option reply from the server");
    }
    if (len > REPLY_MAX) {
      return protocol_error (err, errlen,
                             "option reply of %u bytes is too long", len);
    }
    if (mloop_recv_full (fd, buf, len) == -1)
      goto io_error;
    if (type == NBD_REP_INFO) {
      take_info (buf, len, x);
      have_export |= len >= 2 && buf[0] == 0 && buf[1] == NBD_INFO_EXPORT;
    }
    else if (type == NBD_REP_ACK) {
      if (!have_export) {
        return protocol_error (err, errlen, "server sent no export size");
      }
      return 1;
    }
    else if (type == NBD_REP_ERR_UNSUP)
      return 0;
    else if (type & 0x80000000u)
      return protocol_error (err, errlen, "server refused export '%s' (NBD "
                             "error reply %#x%s%.*s)", name, type,
                             len ? ": " : "", (int) (len < 200 ? len : 200),
                             (const char *) buf);
    /* Other reply types are informational: ignore. */
  }

 io_error:
  snprintf (err, errlen, "NBD handshake: %s", strerror (errno));
  return -1;
}

static int
export_name (int fd, const char *name, bool no_zeroes,
             struct mloop_nbd_export *x, char *err, size_t errlen)
{
  unsigned char buf[10 + 124];

  if (send_option (fd, NBD_OPT_EXPORT_NAME, name, (uint32_t) strlen (name))
      == -1 || mloop_recv_full (fd, buf, no_zeroes ? 10 : sizeof buf) == -1) {
    snprintf (err, errlen, "NBD handshake (export name): %s",
              strerror (errno));
    return -1;
  }
  memcpy (&x->size, buf, 8);
  x->size = be64toh (x->size);
  memcpy (&x->flags, buf + 8, 2);
  x->flags = be16toh (x->flags);
  return 0;
}

int
mloop_nbd_client_go (int fd, const char *name, struct mloop_nbd_export *x,
                     char *err, size_t errlen)
{
  struct {
    uint64_t magic, opt_magic;
    uint16_t flags;
  } __attribute__((packed)) greeting;
  uint32_t client_flags = NBD_FLAG_C_FIXED_NEWSTYLE;
  uint16_t server_flags;
  int r;

  memset (x, 0, sizeof *x);
  if (mloop_recv_full (fd, &greeting, sizeof greeting) == -1) {
    snprintf (err, errlen, "NBD handshake: %s", strerror (errno));
    return -1;
  }
  if (be64toh (greeting.magic) != NBD_MAGIC ||
      be64toh (greeting.opt_magic) != NBD_IHAVEOPT) {
    return protocol_error (err, errlen, "not a newstyle NBD server");
  }
  server_flags = be16toh (greeting.flags);
  if (!(server_flags & NBD_FLAG_FIXED_NEWSTYLE)) {
    return protocol_error (err, errlen,
                           "NBD server does not speak fixed newstyle");
  }
  if (server_flags & NBD_FLAG_NO_ZEROES)
    client_flags |= NBD_FLAG_C_NO_ZEROES;
  client_flags = htobe32 (client_flags);
  if (mloop_send_full (fd, &client_flags, 4) == -1) {
    snprintf (err, errlen, "NBD handshake: %s", strerror (errno));
    return -1;
  }
  r = go (fd, name, x, err, errlen);
  if (r != 0)
    return r == 1 ? 0 : -1;
  return export_name (fd, name, server_flags & NBD_FLAG_NO_ZEROES, x, err,
                      errlen);
}
