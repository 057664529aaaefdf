/* mloop — an image reached through a descriptor rather than its name.
 *
 * mloop's D-Bus service attaches an image the caller opened and passed
 * over the bus: the kernel decided, at the caller's open, whether that
 * user may read or write it.  The service never opens the name the
 * caller gave (as root it could open anything), nor reopens the file:
 * each server serves the caller's own open file, which it inherits as
 * descriptor MLOOP_HELD_IMAGE_FD and is told of by the name
 * MLOOP_HELD_IMAGE_PATH (engine/backing.h: a name of a descriptor is
 * served as it is open, so the kernel's decision at the caller's open is
 * the one that holds, and a file root may not open, on root-squashed
 * NFS, is served all the same).  The
 * supervisor inherits it too and hands it to every server it restarts,
 * so a restart reaches the same file however its name changes since.
 *
 * A process holds at most one such image, set before it starts the
 * processes that serve it (the service attaches one image at a time).
 */
#ifndef MLOOP_HELD_IMAGE_H
#define MLOOP_HELD_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MLOOP_HELD_IMAGE_FD 3
#define MLOOP_HELD_IMAGE_PATH "/proc/self/fd/3"

/* From now on the processes this one starts get FD as
 * MLOOP_HELD_IMAGE_FD; -1: none.
 */
void mloop_held_image_set (int fd);
/* The descriptor set, or -1. */
int mloop_held_image_fd (void);
/* Whether IMAGE is the name servers reach a held image by. */
bool mloop_is_held_image (const char *image);

/* The name of the pseudo file system (proc, sysfs, debugfs...) the file
 * open at FD is on, or NULL when it is on none.  What such a file reads
 * depends on who opened it and when (a PCI device's config file gives
 * root all of it and a user its first 64 bytes): it is no disk image,
 * and a held image is never one.
 */
const char *mloop_held_image_pseudo_fs (int fd);

/* The name of the file system in memory (tmpfs, which memfd_create's
 * files are on too, ramfs, hugetlbfs) the file open at FD is on, or
 * NULL when it is on none.  Written through a device, such a file's
 * pages are the server's: charged to the service's cgroup, root's, not
 * to the user who fills them, and on ramfs bounded by nothing.
 */
const char *mloop_held_image_memory_fs (int fd);

/* How much of a process's mountinfo is read looking for a mount.  A
 * line is a hundred bytes or two, and a host with thousands of mounts
 * shows a megabyte or two; but a user may make 100,000 mounts
 * (fs.mount-max) in a mount namespace of their own, on paths as deep as
 * they like, each byte of them shown as up to four escaped: gigabytes,
 * which the service would read (12 s for 300 MB) and hold, in the
 * device thread that serves every user.  A line is kept up to
 * MLOOP_HELD_MOUNTINFO_LINE_MAX bytes: what is looked at of it, the
 * file system's type, source and options, takes a few kilobytes.
 */
#define MLOOP_HELD_MOUNTINFO_MAX (8u << 20)
#define MLOOP_HELD_MOUNTINFO_LINE_MAX (64u << 10)

/* Where the file a held image's descriptor is open on is mounted, as
 * the caller's process PID sees it (/proc/PID/mountinfo): the mount
 * with id MNT_ID, which statx gives asking the file system nothing.
 * Every look at the data or attributes of a file on a FUSE file system
 * a user mounted may wait on a server its user runs, for as long as
 * they like (a server stopped with SIGSTOP answers never), and the
 * service would wait with it: one whose user_id is not root's, or any,
 * whatever its user_id, when the caller is in a user namespace other
 * than the service's (where its user may be root, and mount FUSE with
 * user_id=0 as that namespace numbers them; the kernel refuses root's
 * look at it only while fuse's allow_sys_admin_access is off); so may
 * one on a mount the caller no
 * longer has (unmounted lazily since the file was opened), whose file
 * system no mountinfo shows; so may one through an overlay its user
 * made of their FUSE file system, where they are root.  None is a held
 * image.  At most MLOOP_HELD_MOUNTINFO_MAX bytes of the mountinfo are
 * read.  PID 0 (not known) or MNT_ID 0 (a kernel before 5.8): the file
 * system is looked for in this process's mounts by its device number,
 * MAJOR:MINOR.
 */
enum mloop_held_mount {
  MLOOP_HELD_MOUNT_SEEN,        /* mounted, and no user's FUSE */
  /* A user's FUSE file system; *MOUNTER: its user_id, as the
   * namespace it was mounted in numbers it.
   */
  MLOOP_HELD_MOUNT_USERS_FUSE,
  MLOOP_HELD_MOUNT_UNSEEN,      /* not among the caller's mounts */
  /* An overlay file system, and the caller in a user namespace of its
   * own, where its user may have made it of layers the service cannot
   * see: their FUSE file system, to which the overlay asks with their
   * rights whatever root asks, or a tmpfs.
   */
  MLOOP_HELD_MOUNT_USERS_OVERLAY,
  /* Not in the first MLOOP_HELD_MOUNTINFO_MAX bytes of the caller's
   * mountinfo, or its line longer than MLOOP_HELD_MOUNTINFO_LINE_MAX.
   */
  MLOOP_HELD_MOUNT_TOO_MANY,
};
enum mloop_held_mount mloop_held_image_mount (pid_t pid, uint64_t mnt_id,
                                              unsigned major,
                                              unsigned minor,
                                              unsigned *mounter);

/* Whether NAME may label a held image: an absolute path on one line,
 * no longer than a path can be.  It is kept in the device's state,
 * shown to everyone who lists and written to the service's log, so it
 * is checked before anything else of the call is looked at.  -1 with
 * ERR (which quotes NAME only when it is short enough to be one).
 */
int mloop_held_image_label_check (const char *name, char *err,
                                  size_t errlen);

#endif /* MLOOP_HELD_IMAGE_H */
