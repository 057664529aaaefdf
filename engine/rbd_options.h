/* mloop — the command-line options of an rbd: store, written once.
 *
 * mloop-server and mloop-ublk take the same options for an RBD image,
 * and the mloop command takes the first two (attach and serve pass them
 * on to the servers they start).  They are GOptionEntry initialisers
 * (glib's), so they live where all three programs look: engine/, whose
 * headers each of them includes (the mloop command through
 * libmloop-parse), beside the configuration the options fill
 * (engine.h's mloop_engine_config).  nbd/ is libc only and the servers
 * do not link device/; glib has no place in the engine either, so this
 * header includes none: the macros are expanded only by files that
 * include <glib.h>, and name the caller's variables (gchar *, gboolean,
 * gint) to store into.  nbdkit's plugin spells them as parameters of
 * its own (ceph-conf=, ceph-id=, shared=, lock-record=, io-timeout=).
 */
#ifndef MLOOP_RBD_OPTIONS_H
#define MLOOP_RBD_OPTIONS_H

/* --ceph-conf FILE and --ceph-id NAME, into gchar *CONF and *ID. */
#define MLOOP_CEPH_OPTION_ENTRIES(conf, id) \
  { "ceph-conf", 0, 0, G_OPTION_ARG_FILENAME, &(conf), \
    "For rbd:POOL/IMAGE: the Ceph configuration (default: $CEPH_CONF, " \
    "/etc/ceph/ceph.conf)", "FILE" }, \
  { "ceph-id", 0, 0, G_OPTION_ARG_STRING, &(id), \
    "For rbd:POOL/IMAGE: the cephx user, without \"client.\" (default " \
    "admin; its keyring from the usual places)", "NAME" }

/* What a server of an RBD image takes besides: --shared (gboolean
 * SHARED), --lock-record FILE (gchar *LOCK_RECORD) and --io-timeout
 * SECONDS (gint IO_TIMEOUT, which the server checks is not negative:
 * mloop_engine_config.io_timeout).
 */
#define MLOOP_RBD_SERVER_OPTION_ENTRIES(conf, id, shared, lock_record, \
                                        io_timeout) \
  MLOOP_CEPH_OPTION_ENTRIES (conf, id), \
  { "shared", 0, 0, G_OPTION_ARG_NONE, &(shared), \
    "For rbd:POOL/IMAGE: write without the image's exclusive lock, " \
    "alongside other writers", NULL }, \
  { "lock-record", 0, 0, G_OPTION_ARG_FILENAME, &(lock_record), \
    "For rbd:POOL/IMAGE: record the exclusive lock's holder here, and " \
    "break the lock of the holder recorded before (a killed predecessor); " \
    "and in FILE.image the image's id, to serve the image recorded " \
    "there, whatever has its name now", "FILE" }, \
  { "io-timeout", 0, 0, G_OPTION_ARG_INT, &(io_timeout), \
    "For rbd:POOL/IMAGE: fail a request with EIO when the cluster has not " \
    "answered it in this time (default 0: wait until it does)", "SECONDS" }

#endif /* MLOOP_RBD_OPTIONS_H */
