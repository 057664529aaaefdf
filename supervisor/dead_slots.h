/* mloop-supervisor — the device's dead connection slots, as the kernel
 * announces them (NBD_CMD_LINK_DEAD, device/nbd_events.h).
 *
 * Both modes heal the same way: a connection the kernel drops leaves a
 * dead slot, announced on the nbd multicast group; the supervisor opens
 * a new negotiated connection per dead slot and hands it over
 * (NBD_CMD_RECONFIGURE).  This keeps the count of slots announced and
 * not yet healed, and asks the mode's heal to run.  When announcements
 * were lost (the socket overflowed), the count is unknown: every slot is
 * offered until the kernel has none dead.
 */
#ifndef MLOOP_SUPERVISOR_DEAD_SLOTS_H
#define MLOOP_SUPERVISOR_DEAD_SLOTS_H

#include <stdio.h>

#include <glib.h>

struct dead_slots {
  unsigned count;               /* announced, not yet healed */
  gboolean lost;                /* announcements were lost: fill them all */
  /* Set by dead_slots_listen: */
  int (*device_index) (void *data); /* -1 until the device's state exists */
  void (*heal_soon) (void *data);   /* when there is something to heal */
  void *data;
  const char *without;          /* what is missed without announcements */
  FILE *log;
};

/* Listens for the announcements for the device DEVICE_INDEX (DATA)
 * names and calls HEAL_SOON (DATA) whenever a slot of it dies.  The
 * process subscribes once, for all its devices.  Without the
 * subscription, says so in LOG with WITHOUT (the mode's consequence):
 * not fatal.
 */
void dead_slots_listen (struct dead_slots *d,
                        int (*device_index) (void *data),
                        void (*heal_soon) (void *data), void *data,
                        const char *without, FILE *log);

/* How many connections to open for the dead slots of a device with N:
 * all N when announcements were lost.
 */
unsigned dead_slots_wanted (const struct dead_slots *d, unsigned n);

/* Every dead slot is healed (or will be by a whole new set). */
void dead_slots_forget (struct dead_slots *d);

/* Stops listening (the process's subscription ends with the last). */
void dead_slots_close (struct dead_slots *d);

#endif /* MLOOP_SUPERVISOR_DEAD_SLOTS_H */
