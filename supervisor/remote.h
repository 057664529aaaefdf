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
 * All of it runs as sources on the default main context, so one
 * process may hold many.
 *
 *   mloop-supervisor --dir DIR --remote nbd://HOST[:PORT]/NAME
 */
#ifndef MLOOP_SUPERVISOR_REMOTE_H
#define MLOOP_SUPERVISOR_REMOTE_H

#include <stddef.h>
#include <stdio.h>

struct remote_keeper;

/* Keeps the device whose directory is DIR on the export URI: listens for
 * the kernel's announcements at once, logs to LOG, and calls RELEASED
 * (RK, DATA) once the kernel let an autoclear device go.  NULL with ERR
 * for a URI that does not parse.
 */
struct remote_keeper *
remote_keeper_new (const char *dir, const char *uri, FILE *log,
                   void (*released) (struct remote_keeper *rk, void *data),
                   void *data, char *err, size_t errlen);

/* Stops every source of RK and frees it; after RELEASED, also removes
 * the device's directory.
 */
void remote_keeper_stop (struct remote_keeper *rk);

#endif /* MLOOP_SUPERVISOR_REMOTE_H */
