/* mloop — opening an rbd: store, from a module loaded on demand.
 *
 * librbd pulls in librados and Ceph's common library (tens of MiB of C++
 * with their own threads): linking them into every front end would cost
 * each start of a server of a plain file (measured for GnuTLS, a tenth of
 * the size: ~100 ms a start under emulation).  So the RBD store is a
 * module, mloop-store-rbd.so, dlopen'ed by the first rbd: name, as
 * mloop-server's TLS is.  Found at $MLOOP_RBD_MODULE if set; else in the
 * build tree, in engine/ beside the front end's directory (the file
 * that holds the engine: the plugin, or the program); else in the
 * installed LIBDIR/mloop.
 */
#ifndef MLOOP_RBD_LOAD_H
#define MLOOP_RBD_LOAD_H

#include <stddef.h>

struct mloop_store;
struct mloop_engine_config;

/* The module's one entry point, and its name. */
#define MLOOP_RBD_OPEN_SYMBOL "mloop_rbd_store_module_open"
typedef int mloop_rbd_open_fn (struct mloop_store **out,
                               const struct mloop_engine_config *cfg,
                               char *err, size_t errlen);

/* Where the module is looked for (see above), into PATH of LEN bytes:
 * the name mloop_rbd_store_open loads.
 */
void mloop_rbd_module_path (char *path, size_t len);

/* Loads the module and opens CFG's rbd: image as *OUT: 0, or a negative
 * errno with a one-line reason in ERR (which names the module when it
 * is missing, or librbd when this build has none).
 */
int mloop_rbd_store_open (struct mloop_store **out,
                          const struct mloop_engine_config *cfg,
                          char *err, size_t errlen);

#endif /* MLOOP_RBD_LOAD_H */
