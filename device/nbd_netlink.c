/* mloop — the kernel NBD client's generic-netlink interface (libnl-genl-3). */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <linux/nbd-netlink.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/netlink.h>

#include "errmsg.h"
#include "nbd_netlink.h"
#include "nbd_sysfs.h"

/* From <linux/nbd.h>, which is not included: its protocol constants
 * would clash with nbd/nbd_proto.h's.
 */
#ifndef NBD_CFLAG_DISCONNECT_ON_CLOSE
#define NBD_CFLAG_DISCONNECT_ON_CLOSE (1 << 1)
#endif

/* Fills ERR and returns RET (a negative errno). */
#define fail(err, errlen, ret, ...) (mloop_fail (err, errlen, __VA_ARGS__), (ret))

/* What one request brought back. */
struct reply {
  bool done;
  int error;                    /* -errno from the kernel's NLMSG_ERROR */
  int index;                    /* NBD_ATTR_INDEX of a CONNECT reply */
  int want_index;               /* STATUS: the device asked about */
  bool connected;
};

static int
parse_status (struct nlattr *list, struct reply *r)
{
  struct nlattr *item;
  int rem;

  nla_for_each_nested (item, list, rem) {
    struct nlattr *a[NBD_DEVICE_ATTR_MAX + 1];

    if (nla_type (item) != NBD_DEVICE_ITEM ||
        nla_parse_nested (a, NBD_DEVICE_ATTR_MAX, item, NULL) < 0 ||
        !a[NBD_DEVICE_INDEX] || !a[NBD_DEVICE_CONNECTED])
      continue;
    if ((int) nla_get_u32 (a[NBD_DEVICE_INDEX]) == r->want_index)
      r->connected = nla_get_u8 (a[NBD_DEVICE_CONNECTED]) != 0;
  }
  return NL_OK;
}

static int
on_valid (struct nl_msg *msg, void *arg)
{
  struct reply *r = arg;
  struct nlattr *a[NBD_ATTR_MAX + 1];

  if (genlmsg_parse (nlmsg_hdr (msg), 0, a, NBD_ATTR_MAX, NULL) < 0)
    return NL_SKIP;
  if (a[NBD_ATTR_INDEX])
    r->index = (int) nla_get_u32 (a[NBD_ATTR_INDEX]);
  if (a[NBD_ATTR_DEVICE_LIST])
    parse_status (a[NBD_ATTR_DEVICE_LIST], r);
  return NL_OK;
}

static int
on_ack (struct nl_msg *msg, void *arg)
{
  ((struct reply *) arg)->done = true;
  return NL_STOP;
}

static int
on_error (struct sockaddr_nl *who, struct nlmsgerr *e, void *arg)
{
  struct reply *r = arg;

  r->error = e->error;
  r->done = true;
  return NL_STOP;
}

/* A connected generic-netlink socket and the nbd family's id. */
struct channel {
  struct nl_sock *sock;
  int family;
};

static int
channel_open (struct channel *ch, char *err, size_t errlen)
{
  int r;

  ch->sock = nl_socket_alloc ();
  if (ch->sock == NULL)
    return fail (err, errlen, -ENOMEM, "netlink: out of memory");
  r = genl_connect (ch->sock);
  if (r < 0) {
    nl_socket_free (ch->sock);
    return fail (err, errlen, -EIO, "netlink: cannot connect: %s",
                 nl_geterror (r));
  }
  ch->family = genl_ctrl_resolve (ch->sock, NBD_GENL_FAMILY_NAME);
  if (ch->family < 0) {
    nl_socket_free (ch->sock);
    return fail (err, errlen, -ENOENT,
                 "the kernel has no NBD client: 'modprobe nbd' failed and "
                 "there is no \"nbd\" netlink family (install the kernel's "
                 "nbd module or use a kernel with CONFIG_BLK_DEV_NBD)");
  }
  return 0;
}

static struct nl_msg *
channel_message (struct channel *ch, uint8_t cmd)
{
  struct nl_msg *msg = nlmsg_alloc ();

  if (msg && !genlmsg_put (msg, NL_AUTO_PORT, NL_AUTO_SEQ, ch->family,
                           0, 0, cmd, NBD_GENL_VERSION)) {
    nlmsg_free (msg);
    msg = NULL;
  }
  return msg;
}

/* Opens a channel and starts a CMD message on it: 0, or -errno with
 * nothing left open.
 */
static int
channel_start (struct channel *ch, uint8_t cmd, struct nl_msg **msg,
               const char *what, char *err, size_t errlen)
{
  int rc = channel_open (ch, err, errlen);

  if (rc < 0)
    return rc;
  *msg = channel_message (ch, cmd);
  if (*msg == NULL) {
    nl_socket_free (ch->sock);
    return fail (err, errlen, -ENOMEM, "netlink %s: no memory", what);
  }
  return 0;
}

/* Gives up on a message whose attributes did not fit. */
static int
channel_abandon (struct channel *ch, struct nl_msg *msg, const char *what,
                 char *err, size_t errlen)
{
  nlmsg_free (msg);
  nl_socket_free (ch->sock);
  return fail (err, errlen, -ENOMEM, "netlink %s: message too large", what);
}

/* Sends MSG (consumed), collects the reply and the ACK into R, closes
 * the channel.  Returns 0 or -errno.
 */
static int
channel_transact (struct channel *ch, struct nl_msg *msg, struct reply *r,
                  const char *what, char *err, size_t errlen)
{
  struct nl_cb *cb = nl_cb_alloc (NL_CB_DEFAULT);
  int rc = -ENOMEM;

  if (cb == NULL) {
    nlmsg_free (msg);
    nl_socket_free (ch->sock);
    return fail (err, errlen, rc, "netlink %s: no memory", what);
  }
  nl_cb_set (cb, NL_CB_VALID, NL_CB_CUSTOM, on_valid, r);
  nl_cb_set (cb, NL_CB_ACK, NL_CB_CUSTOM, on_ack, r);
  nl_cb_err (cb, NL_CB_CUSTOM, on_error, r);
  rc = nl_send_auto (ch->sock, msg);
  if (rc < 0) {
    rc = -EIO;
    goto out;
  }
  while (!r->done) {
    rc = nl_recvmsgs (ch->sock, cb);
    if (rc < 0 && r->error == 0)
      r->error = -EIO;
    if (rc < 0)
      break;
  }
  rc = r->error;
 out:
  if (rc < 0)
    mloop_fail (err, errlen, "netlink %s: %s", what, strerror (-rc));
  nl_cb_put (cb);
  nlmsg_free (msg);
  nl_socket_free (ch->sock);
  return rc;
}

/* Runs "modprobe nbd" quietly; whether it worked shows in the retry. */
static void
load_nbd_module (void)
{
  static char *const argv[] = { "modprobe", "-q", "nbd", NULL };
  posix_spawn_file_actions_t fa;
  pid_t pid;
  int status;

  posix_spawn_file_actions_init (&fa);
  posix_spawn_file_actions_addopen (&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen (&fa, 2, "/dev/null", O_WRONLY, 0);
  if (posix_spawnp (&pid, "modprobe", &fa, NULL, argv, NULL) == 0)
    waitpid (pid, &status, 0);
  posix_spawn_file_actions_destroy (&fa);
}

/* Set once, before the process has threads: modprobe was run then. */
static bool loaded_early;

void
mloop_nbd_netlink_load_early (void)
{
  struct channel ch;
  char ignored[256];

  if (channel_open (&ch, ignored, sizeof ignored) < 0)
    load_nbd_module ();
  else
    nl_socket_free (ch.sock);
  loaded_early = true;
}

int
mloop_nbd_netlink_available (char *err, size_t errlen)
{
  struct channel ch;

  if (channel_open (&ch, err, errlen) < 0) {
    if (loaded_early)
      return -ENOENT;
    load_nbd_module ();
    if (channel_open (&ch, err, errlen) < 0)
      return -ENOENT;
  }
  nl_socket_free (ch.sock);
  return 0;
}

static int
put_sockets (struct nl_msg *msg, const int *fds, size_t nr_fds)
{
  struct nlattr *list = nla_nest_start (msg, NBD_ATTR_SOCKETS);

  if (list == NULL)
    return -1;
  for (size_t i = 0; i < nr_fds; i++) {
    struct nlattr *item = nla_nest_start (msg, NBD_SOCK_ITEM);

    if (item == NULL || nla_put_u32 (msg, NBD_SOCK_FD, fds[i]) < 0)
      return -1;
    nla_nest_end (msg, item);
  }
  nla_nest_end (msg, list);
  return 0;
}

int
mloop_nbd_netlink_connect (const struct mloop_nbd_device_config *c,
                           int *index, char *err, size_t errlen)
{
  struct channel ch;
  struct reply r = { .index = -1 };
  struct nl_msg *msg;
  int rc;

  rc = channel_start (&ch, NBD_CMD_CONNECT, &msg, "connect", err, errlen);
  if (rc < 0)
    return rc;
  if ((c->index >= 0 && nla_put_u32 (msg, NBD_ATTR_INDEX, c->index) < 0) ||
      nla_put_u64 (msg, NBD_ATTR_SIZE_BYTES, c->size) < 0 ||
      nla_put_u64 (msg, NBD_ATTR_BLOCK_SIZE_BYTES, c->block_size) < 0 ||
      nla_put_u64 (msg, NBD_ATTR_SERVER_FLAGS, c->server_flags) < 0 ||
      (c->timeout && nla_put_u64 (msg, NBD_ATTR_TIMEOUT, c->timeout) < 0) ||
      (c->dead_conn_timeout &&
       nla_put_u64 (msg, NBD_ATTR_DEAD_CONN_TIMEOUT,
                    c->dead_conn_timeout) < 0) ||
      (c->backend &&
       nla_put_string (msg, NBD_ATTR_BACKEND_IDENTIFIER, c->backend) < 0) ||
      put_sockets (msg, c->fds, c->nr_fds) < 0)
    return channel_abandon (&ch, msg, "connect", err, errlen);
  rc = channel_transact (&ch, msg, &r, "connect", err, errlen);
  if (rc == -EBUSY)
    mloop_fail (err, errlen, "/dev/nbd%d is busy (already connected)",
          c->index);
  if (rc < 0)
    return rc;
  if (r.index < 0)
    return fail (err, errlen, -EPROTO,
                 "netlink connect: the kernel did not name the device");
  *index = r.index;
  return 0;
}

/* What one NBD_CMD_RECONFIGURE changes; zero fields change nothing. */
struct change {
  const int *fds;               /* sockets for dead connections */
  size_t nr_fds;
  uint64_t dead_conn_timeout;
  uint64_t size;                /* bytes */
  bool disconnect_on_close;
};

int
mloop_nbd_backend_check_at (const char *sys_block, int index,
                            const char *backend, char *err, size_t errlen)
{
  char *there = mloop_nbd_sysfs_backend (sys_block, index);
  int rc = 0;

  if (there == NULL || *there == '\0')
    rc = fail (err, errlen, -ESTALE, "/dev/nbd%d has no backend (not "
               "connected, or another tool's device), not %s", index,
               backend ? backend : "(none)");
  else if (backend == NULL || strcmp (there, backend) != 0) {
    /* Another tool may have named anything: one line all the same. */
    for (char *c = there; *c; c++)
      if ((unsigned char) *c < 0x20 || *c == 0x7f)
        *c = '?';
    rc = fail (err, errlen, -ESTALE, "/dev/nbd%d is connected with "
               "backend %s, not %s", index, there,
               backend ? backend : "(none)");
  }
  g_free (there);
  return rc;
}

/* Sends one reconfigure of /dev/nbdINDEX.  BACKEND must repeat the
 * device's identifier (the kernel refuses a reconfigure without it);
 * the device must show it (mloop_nbd_backend_check_at).  WHAT names
 * the request in errors.
 */
static int
reconfigure (int index, const char *backend, const struct change *c,
             const char *what, char *err, size_t errlen)
{
  struct channel ch;
  struct reply r = { .index = -1 };
  struct nl_msg *msg;
  char why[8192];
  int rc;

  rc = mloop_nbd_backend_check_at ("/sys/block", index, backend, why,
                                   sizeof why);
  if (rc < 0)
    return fail (err, errlen, rc, "netlink %s refused: %s", what, why);
  rc = channel_start (&ch, NBD_CMD_RECONFIGURE, &msg, what, err, errlen);
  if (rc < 0)
    return rc;
  if (nla_put_u32 (msg, NBD_ATTR_INDEX, index) < 0 ||
      (backend &&
       nla_put_string (msg, NBD_ATTR_BACKEND_IDENTIFIER, backend) < 0) ||
      (c->dead_conn_timeout &&
       nla_put_u64 (msg, NBD_ATTR_DEAD_CONN_TIMEOUT,
                    c->dead_conn_timeout) < 0) ||
      (c->size && nla_put_u64 (msg, NBD_ATTR_SIZE_BYTES, c->size) < 0) ||
      (c->disconnect_on_close &&
       nla_put_u64 (msg, NBD_ATTR_CLIENT_FLAGS,
                    NBD_CFLAG_DISCONNECT_ON_CLOSE) < 0) ||
      (c->nr_fds && put_sockets (msg, c->fds, c->nr_fds) < 0))
    return channel_abandon (&ch, msg, what, err, errlen);
  return channel_transact (&ch, msg, &r, what, err, errlen);
}

int
mloop_nbd_netlink_reconfigure (int index, const char *backend,
                               const int *fds, size_t nr_fds,
                               uint64_t dead_conn_timeout,
                               char *err, size_t errlen)
{
  const struct change c = {
    .fds = fds, .nr_fds = nr_fds, .dead_conn_timeout = dead_conn_timeout,
  };

  return reconfigure (index, backend, &c, "reconfigure", err, errlen);
}

int
mloop_nbd_netlink_set_size (int index, const char *backend, uint64_t size,
                            char *err, size_t errlen)
{
  const struct change c = { .size = size };

  return reconfigure (index, backend, &c, "resize", err, errlen);
}

int
mloop_nbd_netlink_disconnect_on_close (int index, const char *backend,
                                       char *err, size_t errlen)
{
  const struct change c = { .disconnect_on_close = true };

  return reconfigure (index, backend, &c, "autoclear", err, errlen);
}

/* A socket's send timeout, or -1. */
static int
send_timeout (int fd, struct timeval *tv)
{
  socklen_t len = sizeof *tv;

  return getsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, tv, &len);
}

int
mloop_nbd_netlink_replace_dead (int index, const char *backend, int fd,
                                uint64_t dead_conn_timeout,
                                char *err, size_t errlen)
{
  struct timeval tv = { 0 };
  int rc;

  if (setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == -1)
    return fail (err, errlen, -errno, "socket send timeout: %s",
                 strerror (errno));
  rc = mloop_nbd_netlink_reconfigure (index, backend, &fd, 1,
                                      dead_conn_timeout, err, errlen);
  if (rc < 0)
    return rc;
  if (send_timeout (fd, &tv) == -1)
    return fail (err, errlen, -errno, "socket send timeout: %s",
                 strerror (errno));
  /* Taken: nbd_reconnect_socket set sk_sndtimeo = the request timeout. */
  return tv.tv_sec != 0 || tv.tv_usec != 0;
}

/* A request that carries nothing but the device index. */
static int
simple_request (uint8_t cmd, int index, struct reply *r, const char *what,
                char *err, size_t errlen)
{
  struct channel ch;
  struct nl_msg *msg;
  int rc;

  rc = channel_start (&ch, cmd, &msg, what, err, errlen);
  if (rc < 0)
    return rc;
  if (nla_put_u32 (msg, NBD_ATTR_INDEX, index) < 0)
    return channel_abandon (&ch, msg, what, err, errlen);
  return channel_transact (&ch, msg, r, what, err, errlen);
}

int
mloop_nbd_netlink_disconnect (int index, char *err, size_t errlen)
{
  struct reply r = { .index = -1 };

  return simple_request (NBD_CMD_DISCONNECT, index, &r, "disconnect",
                         err, errlen);
}

int
mloop_nbd_netlink_connected (int index, bool *connected,
                             char *err, size_t errlen)
{
  struct reply r = { .index = -1, .want_index = index };
  int rc;

  rc = simple_request (NBD_CMD_STATUS, index, &r, "status", err, errlen);
  if (rc == 0)
    *connected = r.connected;
  return rc;
}
