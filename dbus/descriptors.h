/* mloop — the descriptors callers pass mloop's D-Bus service, and how
 * they are closed.
 *
 * close(2) of a descriptor a caller passed may wait as long as that
 * caller likes, and needs no right of them: every close of a file of a
 * FUSE file system sends its server a FLUSH and waits for the answer,
 * uninterruptibly once a signal came (a user may mount one in a user
 * namespace of their own); the last close of a TCP socket with
 * SO_LINGER set waits for its unsent data to go, up to the linger time
 * its owner chose, while a peer that never reads holds it (the
 * loopback will do).  GDBus closes a message's descriptors when the
 * message is freed, in the thread that drops its last reference: its
 * one worker thread, which carries all of the service's bus traffic
 * (for a Peer.Ping, an Introspect or an unknown method, which GDBus
 * answers itself, and a signal nobody listens to), the main thread (a
 * call refused at once) or the device thread (an attach done).  Any of
 * them waiting held up every user's call, and the service's stop.
 *
 * So the descriptors are taken out of every message as it arrives,
 * before GDBus looks at it, kept with the message while anything holds
 * it, and closed in closer threads, which nothing else waits for: one
 * per descriptor, at most MLOOP_MAX_CLOSERS at once (more wait their
 * turn, open).  A close that has waited MLOOP_CLOSE_INTERRUPT_S is
 * interrupted with a signal, which ends a socket's linger and any other
 * interruptible wait; one that waits on a FUSE server cannot be, and
 * ends when that server answers or goes.
 */
#ifndef MLOOP_DBUS_DESCRIPTORS_H
#define MLOOP_DBUS_DESCRIPTORS_H

#include <gio/gio.h>

/* Closes waiting at once, each in a thread of its own.  Past them, a
 * descriptor waits, open, for one to end: a user whose FUSE server
 * never answers can keep this many waiting, and no more threads.
 */
#define MLOOP_MAX_CLOSERS 32

/* Seconds after which a close still waiting is interrupted (then every
 * second after that): a lingering socket's close ends.  No close of a
 * descriptor a caller passed is worth waiting for.
 */
#define MLOOP_CLOSE_INTERRUPT_S 2

/* Takes the descriptors out of every message CONNECTION receives from
 * now on, to be closed in closer threads when the message is freed.
 * Called in the main thread, once, before anything is exported or a
 * name asked for: a message that came before keeps its descriptors,
 * which GDBus closes where it frees it.
 */
void mloop_descriptors_take (GDBusConnection *connection);

/* How many descriptors MESSAGE, a received one, carried. */
int mloop_descriptors_count (GDBusMessage *message);

/* A duplicate (close-on-exec) of descriptor INDEX of those MESSAGE
 * carried, the caller's to give to mloop_descriptors_close; -1 with
 * errno (EBADF: it carried no such descriptor).
 */
int mloop_descriptors_dup (GDBusMessage *message, int index);

/* Closes FD, a caller's or a duplicate of one, in a closer thread:
 * never waits.
 */
void mloop_descriptors_close (int fd);

#endif /* MLOOP_DBUS_DESCRIPTORS_H */
