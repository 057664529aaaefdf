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

#define RELEASE_POLL_MS 500

/* Watches the device whose directory is DIR.  Once it is released, calls
 * RELEASED with the device's lock held (mloop_state_lock_device's
 * descriptor, for the callee to unlock): no detach or resize of it runs
 * until it is cleaned up.
 */
void mloop_release_watch (const char *dir, void (*released) (int lock));

#endif /* MLOOP_RELEASE_WATCH_H */
