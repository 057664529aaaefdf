/* mloop — autoclear: a device that goes away when its last user closes it.
 *
 * As a loop device with LO_FLAGS_AUTOCLEAR (what `mount -o loop` sets),
 * an autoclear device is detached when its last opener closes it.  The
 * kernel does the disconnecting (NBD_CFLAG_DISCONNECT_ON_CLOSE); the
 * device's supervisor notices the device is gone and stops the server
 * and removes the device's directory, since no mloop command runs then.
 */
#ifndef MLOOP_AUTOCLEAR_H
#define MLOOP_AUTOCLEAR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "device_state.h"

/* Marks the attached device S autoclear, in the kernel and in its state.
 * From then on the next last close detaches it, so call it once the
 * device is in use or about to be (attach's own opens are over).
 */
int mloop_autoclear_enable (struct mloop_device_state *s, char *err,
                            size_t errlen);

/* What autoclear asks of the kernel about a device, and does to its
 * nodes: the real kernel's (mloop_autoclear_kernel_now), or a test's.
 */
struct mloop_autoclear_kernel {
  /* 1 when nbd device INDEX has a configuration (an image connected, or
   * a descriptor open on it: the kernel gives an idle device opened one),
   * 0 when it has none, -1 when the kernel cannot be asked.
   */
  int (*connected) (int index);
  /* The backend device INDEX's configuration names (g_free), or NULL. */
  char *(*backend) (int index);
  /* Whether device INDEX is started (sysfs "pid": a connect gave it its
   * sockets), not just configured by a descriptor open on it.
   */
  bool (*running) (int index);
  /* Whether the device shown at INDEX with BACKEND is an mloop device
   * of OWNER's (mloop_state_nbd_device_of).
   */
  bool (*device_of) (int index, const char *backend, uid_t owner);
  /* The owner of node NAME ("nbdN"), or (uid_t) -1 when it has none. */
  uid_t (*node_owner) (const char *name);
  /* Gives node NAME ("nbdN") and its partitions' back to root
   * (device_owner.h): whether NAME's node is root's only now.
   */
  bool (*give_back) (const char *name);
};

extern const struct mloop_autoclear_kernel mloop_autoclear_kernel_now;

/* Whether autoclear device S is gone for good, so that its supervisor
 * may remove its state:
 * - the kernel let it go and, for a device attached for a user, its
 *   node is root's again with no descriptor open on the device;
 * - or another image is connected there by now.  S's node, if still
 *   S's owner's, is given back to root first unless another mloop
 *   device there is that owner's: an mloop attach gives the node back
 *   before it connects, and then to its own owner, but another tool
 *   (with no backend, an empty one, or a name of its own) leaves it.
 * The node goes back to root before the kernel is asked the second
 * time: until then its user may open the idle device, which the kernel
 * then keeps for them, and asked only before, the device would be
 * forgotten while they hold it, uncounted, its node still theirs
 * (mloop-dbus's cap counts a user's devices by the state).  Asked of K.
 */
bool mloop_autoclear_finished (const struct mloop_device_state *s,
                               const struct mloop_autoclear_kernel *k);

#endif /* MLOOP_AUTOCLEAR_H */
