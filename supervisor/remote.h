/* mloop-supervisor — the remote mode: a device on an nbd:// export.
 *
 * There is no server of ours to restart: the remote one restarts on its
 * own (or its machine does).  When it goes away, each connection's
 * receive fails and the kernel announces the slot dead
 * (NBD_CMD_LINK_DEAD, nbd_events.h); the device was attached with a long
 * dead-connection timeout (attach.h), so IO waits meanwhile.  The
 * supervisor answers by connecting to the export again, with backoff
 * while it is unreachable, and hands the kernel one fresh negotiated
 * connection per dead slot (NBD_CMD_RECONFIGURE).  An export that comes
 * back with another size or other flags is not reconnected: that is said
 * once, and the device's IO fails at the dead-connection timeout.  A
 * periodic look at the kernel's receive works catches dead slots whose
 * announcements were lost.
 *
 *   mloop-supervisor --dir DIR --remote nbd://HOST[:PORT]/NAME
 */
#ifndef MLOOP_SUPERVISOR_REMOTE_H
#define MLOOP_SUPERVISOR_REMOTE_H

/* Runs until SIGTERM/SIGINT (or autoclear); returns the exit status. */
int mloop_supervise_remote (const char *dir, const char *uri);

#endif /* MLOOP_SUPERVISOR_REMOTE_H */
