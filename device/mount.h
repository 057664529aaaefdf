/* mloop — mounting an image in one step, as `mount -o loop` does.
 *
 * mloop_mount attaches the image, mounts the device with mount(8) (which
 * finds the filesystem type), and only then makes the device autoclear,
 * so the last unmount detaches it (autoclear.h).  mloop_umount unmounts
 * and makes sure the device, its server and its state are gone before it
 * returns.  A failure at any step undoes the earlier ones.
 */
#ifndef MLOOP_MOUNT_H
#define MLOOP_MOUNT_H

#include <stddef.h>

#include "attach.h"

struct mloop_mount_request {
  struct mloop_attach_request attach;   /* attach.read_only follows "ro" */
  const char *dir;
  const char *fstype;           /* NULL: mount(8) finds out */
  const char *options;          /* mount(8)'s -o, or NULL */
};

/* Parses OPTIONS (mount's -o) for what concerns the device: "ro" makes
 * the attach read-only.  Everything goes on to mount(8) as given.
 */
void mloop_mount_parse_options (struct mloop_mount_request *req);

/* Attaches and mounts; fills *DEVICE_INDEX. */
int mloop_mount (struct mloop_mount_request *req, int *device_index,
                 char *err, size_t errlen);

/* Unmounts DIR, mounted from an mloop device, and detaches the device. */
int mloop_umount (const char *dir, char *err, size_t errlen);

#endif /* MLOOP_MOUNT_H */
