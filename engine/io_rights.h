/* mloop — what the threads that do a device's IO may do beyond the open
 * file they serve.
 *
 * A server runs as root, with CAP_SYS_RESOURCE (which PR_SET_IO_FLUSHER
 * needs).  Writing a file, both let the writer past what the file
 * system keeps from users: a disk quota's hard limit is not enforced on
 * a writer with CAP_SYS_RESOURCE, and ext4's reserved blocks (5% by
 * default, kept so that root's services go on when users fill the file
 * system) are open to fsuid 0 and to CAP_SYS_RESOURCE.  An image served
 * as an open descriptor (a user's, passed to mloop-dbus: held_image.h)
 * is served with what its opener was given, no more: each IO thread
 * then writes with the overflow user's file system uid and group, no
 * supplementary groups, and CAP_SYS_RESOURCE out of its effective set,
 * so that a user cannot write through their device what they could not
 * write to the file themselves.
 */
#ifndef MLOOP_IO_RIGHTS_H
#define MLOOP_IO_RIGHTS_H

#include <stdbool.h>

/* From now on, the IO threads that start (mloop_io_thread) write with
 * no right beyond the open file's.  Called when the image is a
 * descriptor's, before any IO thread starts.
 */
void mloop_io_rights_open_file_only (void);

/* Prepares the calling thread, once, to do a device's IO: an IO flusher
 * (memory_pressure.h), then, when the image is a descriptor's, without
 * the rights above.  Returns whether it is an IO flusher.
 */
bool mloop_io_thread (void);

#endif /* MLOOP_IO_RIGHTS_H */
