/* mloop — where librados would find a Ceph configuration when none is
 * named.
 *
 * The RBD store judges the file before librados reads it (rbd_store.c:
 * a configuration says which cluster is served and where librados
 * writes as root), so it does librados's search itself; and `mloop
 * attach` does the same search in its caller's environment and records
 * the file found in the device's name, since the device's servers run
 * elsewhere (mloopd's environment, in /) and would find another.  libc
 * only: the store module and the device library both build it.
 */
#ifndef MLOOP_CEPH_CONF_H
#define MLOOP_CEPH_CONF_H

/* Opens the configuration librados's search would read, in this
 * process's environment and working directory: $CEPH_CONF's list where
 * it is set, else /etc/ceph/ceph.conf, $HOME/.ceph/ceph.conf and
 * ceph.conf here, the first that opens and is no directory (a FIFO or
 * a device too, which librados would read: the caller refuses it).  A
 * descriptor of the file looked at, never of one put there since, with
 * the place in *FOUND (malloc'ed, as the search spells it: the last is
 * relative), or a negative errno: -ENOENT, none; -ENOTSUP, a place of
 * $CEPH_CONF's names a variable other than $cluster and $home (in
 * *FOUND); -ENOMEM.  The descriptor may be O_PATH, to fstat() only:
 * for a FIFO or a device, which is only looked at (opening one is an
 * act: a FIFO's writer woken, a watchdog started), and for a regular
 * file where /proc is missing (a chroot, a small container); else a
 * regular file's is open to read (O_RDONLY, not blocking).  A reader
 * goes through /proc/self/fd/N, which takes either.
 */
int mloop_ceph_conf_open_searched (char **found);

/* The cluster librados names after CONF, a configuration file it is
 * given by name (md_config_t::get_cluster_name, std::filesystem's
 * stem): the file's name without its ".conf" when it ends so
 * ("/etc/ceph/x.conf.d.conf": x.conf.d), else "ceph" (backup.conf.orig,
 * .conf); "ceph" for NULL, none given, whatever file librados's own
 * search then finds.  $cluster in the configuration's values (the
 * default keyring /etc/ceph/$cluster.$name.keyring, a log file's, an
 * admin socket's) is that name.  Malloc'ed, or NULL (no memory).
 */
char *mloop_ceph_cluster_name (const char *conf);

#endif /* MLOOP_CEPH_CONF_H */
