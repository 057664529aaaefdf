/* mloop — names of images that are not local files.
 *
 * An RBD image is named as the engine takes it (engine.h):
 * "rbd:[POOL/]IMAGE[@SNAP]", and what a device needs to reach it again
 * (the Ceph configuration, the cephx user) rides along as qemu's options
 * do, ":conf=FILE:id=NAME".  The whole name is what a device records and
 * every server restarted for it is given, so a restart connects the same
 * way; the image itself, for telling whether it is attached already, is
 * the part before the options.
 */
#ifndef MLOOP_STORE_NAME_H
#define MLOOP_STORE_NAME_H

#include <stdbool.h>

/* Whether NAME is an RBD image's ("rbd:..."). */
bool mloop_is_rbd_name (const char *name);

/* NAME with ":conf=CONF" (made absolute) and ":id=ID" added for those
 * not NULL; NULL with ERR when NAME is no RBD image's, or either holds
 * a ':', or ID a '/' (mloop_rbd_name_check).
 */
char *mloop_rbd_name_with (const char *name, const char *conf,
                           const char *id, char *err, size_t errlen);

/* Refuses, in ERR, an RBD image's NAME whose ":conf=" is relative:
 * the name is what a device records and its servers, run in /, are
 * given, so "conf=ceph.conf" would be read as /ceph.conf by every one
 * of them, whatever directory the attach ran in; and one whose ":id="
 * has a '/', which a configuration's paths ($id, $name in log_file)
 * would take out of their directory.  0 or -1.
 */
int mloop_rbd_name_check (const char *name, char *err, size_t errlen);

/* NAME as the device records it: with ":conf=" the configuration
 * librados's search finds here (ceph_conf.h) when NAME names none, made
 * absolute, since the device's servers run elsewhere (mloopd's
 * environment, in /) and would find another, another cluster's image of
 * that name perhaps.  Refused, in ERR, while $CEPH_ARGS, $CEPH_KEYRING or
 * $CEPH_LIB is set: they reach no server the device will have; and when NAME
 * names none and the search finds none, or $CEPH_CONF names a place it
 * cannot judge: the servers would search again, elsewhere.  NULL on
 * failure (g_free the name).
 */
char *mloop_rbd_name_pinned (const char *name, char *err, size_t errlen);

/* The image NAME names, without options and with the default pool
 * spelt out (g_free it): for comparing.
 */
char *mloop_image_identity (const char *name);

#endif /* MLOOP_STORE_NAME_H */
