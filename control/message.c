/* The control socket's messages: see message.h. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include "message.h"

static bool
valid_key (const char *key, size_t len)
{
  if (len == 0 || len > MLOOP_CONTROL_MAX_KEY)
    return false;
  for (size_t i = 0; i < len; i++) {
    char c = key[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'))
      return false;
  }
  return true;
}

void
mloop_control_out_init (struct mloop_control_out *out)
{
  out->len = 0;
  out->n_fields = 0;
  out->too_big = false;
}

/* Whether OUT already has KEY (LEN bytes). */
static bool
out_has (const struct mloop_control_out *out, const char *key, size_t len)
{
  for (size_t at = 0; at < out->len; at += strlen (out->buf + at) + 1)
    if (strncmp (out->buf + at, key, len) == 0 && out->buf[at + len] == '=')
      return true;
  return false;
}

bool
mloop_control_add (struct mloop_control_out *out, const char *key,
                   const char *value)
{
  size_t klen = strlen (key), vlen = strlen (value);

  if (!valid_key (key, klen) || out_has (out, key, klen) ||
      out->n_fields == MLOOP_CONTROL_MAX_FIELDS ||
      klen + 1 + vlen + 1 > sizeof out->buf - out->len) {
    out->too_big = true;
    return false;
  }
  memcpy (out->buf + out->len, key, klen);
  out->buf[out->len + klen] = '=';
  memcpy (out->buf + out->len + klen + 1, value, vlen + 1);
  out->len += klen + 1 + vlen + 1;
  out->n_fields++;
  return true;
}

int
mloop_control_send (int sock, const struct mloop_control_out *out,
                    const int *fds, size_t n_fds)
{
  union {
    struct cmsghdr align;
    char space[CMSG_SPACE (sizeof (int) * MLOOP_CONTROL_MAX_FDS)];
  } control;
  struct iovec iov = { .iov_base = (void *) out->buf, .iov_len = out->len };
  struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1 };
  ssize_t n;

  if (out->too_big || out->len == 0) {
    errno = out->too_big ? EMSGSIZE : EINVAL;
    return -1;
  }
  if (n_fds > MLOOP_CONTROL_MAX_FDS) {
    errno = EINVAL;
    return -1;
  }
  if (n_fds > 0) {
    struct cmsghdr *c;

    memset (&control, 0, sizeof control);
    msg.msg_control = control.space;
    msg.msg_controllen = CMSG_SPACE (sizeof (int) * n_fds);
    c = CMSG_FIRSTHDR (&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN (sizeof (int) * n_fds);
    memcpy (CMSG_DATA (c), fds, sizeof (int) * n_fds);
  }
  do
    n = sendmsg (sock, &msg, MSG_NOSIGNAL);
  while (n == -1 && errno == EINTR);
  return n == -1 ? -1 : 0;
}

/* Collects the descriptors of MSG's control data into IN; any other
 * control data, or more than fit, is counted as refused.  Every
 * descriptor received ends up in IN (to be closed with it) whatever
 * else is wrong, so that none is left open.
 */
static bool
collect_fds (struct msghdr *msg, struct mloop_control_in *in)
{
  bool ok = (msg->msg_flags & MSG_CTRUNC) == 0;

  for (struct cmsghdr *c = CMSG_FIRSTHDR (msg); c; c = CMSG_NXTHDR (msg, c)) {
    size_t n;

    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      ok = false;
      continue;
    }
    n = (c->cmsg_len - CMSG_LEN (0)) / sizeof (int);
    for (size_t i = 0; i < n; i++) {
      int fd;

      memcpy (&fd, CMSG_DATA (c) + i * sizeof (int), sizeof fd);
      if (in->n_fds < MLOOP_CONTROL_MAX_FDS)
        in->fds[in->n_fds++] = fd;
      else {
        close (fd);
        ok = false;
      }
    }
  }
  return ok;
}

int
mloop_control_recv (int sock, struct mloop_control_in *in, char *err,
                    size_t errlen)
{
  /* Room for one descriptor more than allowed, so that too many shows
   * as too many (and all are closed) rather than as truncated data.
   */
  union {
    struct cmsghdr align;
    char space[CMSG_SPACE (sizeof (int) * (MLOOP_CONTROL_MAX_FDS + 1))];
  } control;
  struct iovec iov = { .iov_base = in->buf, .iov_len = sizeof in->buf };
  struct msghdr msg = {
    .msg_iov = &iov, .msg_iovlen = 1,
    .msg_control = control.space, .msg_controllen = sizeof control.space,
  };
  ssize_t n;

  in->n_fds = 0;
  in->n_fields = 0;
  do
    n = recvmsg (sock, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
  while (n == -1 && errno == EINTR);
  if (n == -1) {
    snprintf (err, errlen, "cannot receive a request: %s", strerror (errno));
    return -1;
  }
  if (!collect_fds (&msg, in)) {
    snprintf (err, errlen, "request refused: more than %d descriptors or "
              "other control data", MLOOP_CONTROL_MAX_FDS);
    mloop_control_in_clear (in);
    return -1;
  }
  if (n == 0 && in->n_fds == 0)
    return 0;
  if ((size_t) n > MLOOP_CONTROL_MAX_BYTES) {
    snprintf (err, errlen, "request refused: %zd bytes, more than %d", n,
              MLOOP_CONTROL_MAX_BYTES);
    mloop_control_in_clear (in);
    return -1;
  }
  if (!mloop_control_parse (in, (size_t) n, err, errlen)) {
    mloop_control_in_clear (in);
    return -1;
  }
  return 1;
}

bool
mloop_control_parse (struct mloop_control_in *in, size_t len, char *err,
                     size_t errlen)
{
  in->n_fields = 0;
  if (len == 0 || len > MLOOP_CONTROL_MAX_BYTES) {
    snprintf (err, errlen, "request refused: %zu bytes", len);
    return false;
  }
  if (in->buf[len - 1] != '\0') {
    snprintf (err, errlen, "request refused: its last field has no end");
    return false;
  }
  for (size_t at = 0; at < len; ) {
    const char *field = in->buf + at, *eq = strchr (field, '=');
    size_t flen = strlen (field);

    if (eq == NULL || !valid_key (field, (size_t) (eq - field))) {
      snprintf (err, errlen, "request refused: field %zu is not key=value "
                "with a key of [a-z0-9-]{1,%d}", in->n_fields + 1,
                MLOOP_CONTROL_MAX_KEY);
      return false;
    }
    if (in->n_fields == MLOOP_CONTROL_MAX_FIELDS) {
      snprintf (err, errlen, "request refused: more than %d fields",
                MLOOP_CONTROL_MAX_FIELDS);
      return false;
    }
    in->buf[eq - in->buf] = '\0';
    if (mloop_control_get (in, field) != NULL) {
      snprintf (err, errlen, "request refused: key %s given twice", field);
      return false;
    }
    in->key[in->n_fields] = field;
    in->value[in->n_fields] = eq + 1;
    in->n_fields++;
    at += flen + 1;
  }
  return true;
}

const char *
mloop_control_get (const struct mloop_control_in *in, const char *key)
{
  for (size_t i = 0; i < in->n_fields; i++)
    if (strcmp (in->key[i], key) == 0)
      return in->value[i];
  return NULL;
}

int
mloop_control_take_fd (struct mloop_control_in *in, size_t i)
{
  int fd;

  if (i >= in->n_fds)
    return -1;
  fd = in->fds[i];
  in->fds[i] = -1;
  return fd;
}

void
mloop_control_in_clear (struct mloop_control_in *in)
{
  for (size_t i = 0; i < in->n_fds; i++)
    if (in->fds[i] >= 0)
      close (in->fds[i]);
  in->n_fds = 0;
  in->n_fields = 0;
}

int
mloop_control_peer (int sock, struct ucred *cred)
{
  socklen_t len = sizeof *cred;

  return getsockopt (sock, SOL_SOCKET, SO_PEERCRED, cred, &len);
}
