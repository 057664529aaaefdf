/* mloop — the mount and umount commands, and mount(8)'s helper
 * mount.mloop (the same program under that name), so that
 * `mount -t mloop IMG DIR` works.
 */
#ifndef MLOOP_MOUNT_CMD_H
#define MLOOP_MOUNT_CMD_H

/* mloop mount FILE DIR [-o OPTS] [-t TYPE], and mount.mloop FILE DIR
 * [-sfnv] [-o OPTS] [-t TYPE] (mount(8)'s helper calling convention).
 */
int mloop_cmd_mount (int argc, char **argv);
/* mloop umount DIR */
int mloop_cmd_umount (int argc, char **argv);

#endif /* MLOOP_MOUNT_CMD_H */
