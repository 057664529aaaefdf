/* mloop-supervisor — noticing that the kernel let go of an autoclear
 * device (device/autoclear.h), so the supervisor can clean up after it.
 *
 * The kernel says nothing when it disconnects a device on last close (no
 * netlink announcement; a uevent would need parsing for one attribute),
 * so the device is looked at every RELEASE_POLL_MS, and only while its
 * state says autoclear: one netlink status request per tick.
 */
#ifndef MLOOP_RELEASE_WATCH_H
#define MLOOP_RELEASE_WATCH_H

#include <glib.h>

#define RELEASE_POLL_MS 500

struct release_watch {
  const char *dir;
  void (*released) (int lock, void *data);
  void *data;
  guint source;
};

/* Watches the device whose directory is DIR (kept, not copied).  Once
 * it is released, calls RELEASED (LOCK, DATA) with the device's lock
 * held (mloop_state_lock_device's descriptor, for the callee to
 * unlock): no detach or resize of it runs until it is cleaned up.
 */
void release_watch_start (struct release_watch *w, const char *dir,
                          void (*released) (int lock, void *data),
                          void *data);

/* Stops watching (also after RELEASED was called). */
void release_watch_stop (struct release_watch *w);

#endif /* MLOOP_RELEASE_WATCH_H */
