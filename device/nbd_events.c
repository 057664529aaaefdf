/* mloop — the kernel NBD client's announcements of dead connections
 * (libnl-genl-3).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <linux/nbd-netlink.h>
#include <netlink/genl/ctrl.h>
#include <netlink/genl/genl.h>
#include <netlink/netlink.h>

#include "errmsg.h"
#include "nbd_events.h"

/* Announcements are small, but each costs the socket's buffer a whole
 * skb: room for a few hundred, so a burst from every connection of many
 * devices does not overflow it.
 */
#define RCVBUF (256 << 10)

struct mloop_nbd_events {
  struct nl_sock *sock;
  struct nl_cb *cb;
  int family;
  /* Set for the length of one read: what each announcement is told to. */
  void (*dead) (int index, void *data);
  void *data;
};

/* Multicast messages carry sequence number 0, not the one libnl expects
 * after the socket's own requests: every one is accepted.
 */
static int
any_sequence (struct nl_msg *msg, void *arg)
{
  return NL_OK;
}

static int
on_message (struct nl_msg *msg, void *arg)
{
  struct mloop_nbd_events *ev = arg;
  struct nlmsghdr *nlh = nlmsg_hdr (msg);
  struct genlmsghdr *gh;
  struct nlattr *a[NBD_ATTR_MAX + 1];

  if (nlh->nlmsg_type != ev->family || !genlmsg_valid_hdr (nlh, 0))
    return NL_SKIP;
  gh = nlmsg_data (nlh);
  if (gh->cmd != NBD_CMD_LINK_DEAD ||
      genlmsg_parse (nlh, 0, a, NBD_ATTR_MAX, NULL) < 0 ||
      a[NBD_ATTR_INDEX] == NULL)
    return NL_SKIP;
  ev->dead ((int) nla_get_u32 (a[NBD_ATTR_INDEX]), ev->data);
  return NL_OK;
}

struct mloop_nbd_events *
mloop_nbd_events_open (char *err, size_t errlen)
{
  struct mloop_nbd_events *ev = calloc (1, sizeof *ev);
  int group, r;

  if (ev == NULL || (ev->sock = nl_socket_alloc ()) == NULL ||
      (ev->cb = nl_cb_alloc (NL_CB_DEFAULT)) == NULL) {
    mloop_fail (err, errlen, "netlink events: out of memory");
    goto fail;
  }
  r = genl_connect (ev->sock);
  if (r < 0) {
    mloop_fail (err, errlen, "netlink events: cannot connect: %s",
                nl_geterror (r));
    goto fail;
  }
  /* Both lookups are requests checked against their replies' sequence
   * numbers, with the socket's own callbacks; announcements are read
   * with EV->cb, which checks none.
   */
  ev->family = genl_ctrl_resolve (ev->sock, NBD_GENL_FAMILY_NAME);
  group = genl_ctrl_resolve_grp (ev->sock, NBD_GENL_FAMILY_NAME,
                                 NBD_GENL_MCAST_GROUP_NAME);
  if (ev->family < 0 || group < 0) {
    mloop_fail (err, errlen, "netlink events: the kernel's \"%s\" family "
                "has no \"%s\" group: %s", NBD_GENL_FAMILY_NAME,
                NBD_GENL_MCAST_GROUP_NAME,
                nl_geterror (ev->family < 0 ? ev->family : group));
    goto fail;
  }
  r = nl_socket_add_membership (ev->sock, group);
  if (r < 0) {
    mloop_fail (err, errlen, "netlink events: cannot join \"%s\": %s",
                NBD_GENL_MCAST_GROUP_NAME, nl_geterror (r));
    goto fail;
  }
  nl_socket_set_buffer_size (ev->sock, RCVBUF, 0);
  r = nl_socket_set_nonblocking (ev->sock);
  if (r < 0) {
    mloop_fail (err, errlen, "netlink events: %s", nl_geterror (r));
    goto fail;
  }
  nl_cb_set (ev->cb, NL_CB_SEQ_CHECK, NL_CB_CUSTOM, any_sequence, NULL);
  nl_cb_set (ev->cb, NL_CB_VALID, NL_CB_CUSTOM, on_message, ev);
  return ev;

 fail:
  mloop_nbd_events_close (ev);
  return NULL;
}

int
mloop_nbd_events_fd (const struct mloop_nbd_events *ev)
{
  return nl_socket_get_fd (ev->sock);
}

int
mloop_nbd_events_read (struct mloop_nbd_events *ev,
                       void (*dead) (int index, void *data), void *data,
                       bool *lost, char *err, size_t errlen)
{
  int r;

  ev->dead = dead;
  ev->data = data;
  /* One datagram per call; -NLE_AGAIN once the socket is empty (libnl
   * retries EINTR itself).
   */
  while ((r = nl_recvmsgs_report (ev->sock, ev->cb)) > 0 ||
         r == -NLE_NOMEM) {
    /* ENOBUFS (libnl's NLE_NOMEM): the kernel dropped announcements for
     * want of room; the socket goes on with the next one.
     */
    if (r == -NLE_NOMEM)
      *lost = true;
  }
  if (r < 0 && r != -NLE_AGAIN)
    return mloop_fail (err, errlen, "netlink events: %s", nl_geterror (r));
  return 0;
}

void
mloop_nbd_events_close (struct mloop_nbd_events *ev)
{
  if (ev == NULL)
    return;
  if (ev->cb)
    nl_cb_put (ev->cb);
  if (ev->sock)
    nl_socket_free (ev->sock);
  free (ev);
}
