/* mloop-supervisor — the device's dead connection slots (dead_slots.h). */
#include <glib-unix.h>

#include "dead_slots.h"
#include "nbd_events.h"
#include "say.h"

/* One subscription per process, whatever the number of devices it
 * keeps: each socket of its own would get a copy of every announcement
 * and cost a descriptor per device.  Its announcements are handed to
 * the listening devices they name.
 */
static struct mloop_nbd_events *events;
static guint events_source;
static GPtrArray *listening;    /* of struct dead_slots */

static gboolean on_nbd_event (gint fd, GIOCondition c, gpointer unused);

/* Subscribes unless subscribed; without it, says why in D's log. */
static void
subscribe (struct dead_slots *d)
{
  char err[512];

  if (events)
    return;
  events = mloop_nbd_events_open (err, sizeof err);
  if (events == NULL) {
    say_to (d->log, "%s; %s", err, d->without);
    return;
  }
  events_source = g_unix_fd_add (mloop_nbd_events_fd (events), G_IO_IN,
                                 on_nbd_event, NULL);
}

static void
unsubscribe (void)
{
  if (events_source != 0)
    g_source_remove (events_source);
  events_source = 0;
  mloop_nbd_events_close (events);
  events = NULL;
}

/* An announcement that a slot of /dev/nbdINDEX died. */
static void
on_dead (int index, void *unused)
{
  for (guint i = 0; i < listening->len; i++) {
    struct dead_slots *d = g_ptr_array_index (listening, i);

    if (index >= 0 && d->device_index (d->data) == index)
      d->count++;
  }
}

static gboolean
on_nbd_event (gint fd, GIOCondition c, gpointer unused)
{
  char err[512];
  bool lost = false;
  gboolean keep = G_SOURCE_CONTINUE;

  if (mloop_nbd_events_read (events, on_dead, NULL, &lost,
                             err, sizeof err) == -1) {
    for (guint i = 0; i < listening->len; i++)
      say_to (((struct dead_slots *) g_ptr_array_index (listening, i))->log,
              "%s; listening again", err);
    events_source = 0;          /* removed on return */
    mloop_nbd_events_close (events);
    events = NULL;
    if (listening->len > 0)
      subscribe (g_ptr_array_index (listening, 0));
    lost = true;
    keep = G_SOURCE_REMOVE;
  }
  /* A heal may end a device's listening: a copy of who listens now. */
  g_autoptr (GPtrArray) now = g_ptr_array_copy (listening, NULL, NULL);

  for (guint i = 0; i < now->len; i++) {
    struct dead_slots *d = g_ptr_array_index (now, i);
    int index = d->device_index (d->data);

    if (lost && index >= 0) {
      say_to (d->log, "/dev/nbd%d: some of the kernel's announcements of "
              "dropped connections were lost; offering connections until "
              "it has no dead one", index);
      d->lost = TRUE;
    }
  }
  for (guint i = 0; i < now->len; i++) {
    struct dead_slots *d = g_ptr_array_index (now, i);

    if (g_ptr_array_find (listening, d, NULL) && (d->count > 0 || d->lost))
      d->heal_soon (d->data);
  }
  return keep;
}

void
dead_slots_listen (struct dead_slots *d, int (*device_index) (void *data),
                   void (*heal_soon) (void *data), void *data,
                   const char *without, FILE *log)
{
  d->device_index = device_index;
  d->heal_soon = heal_soon;
  d->data = data;
  d->without = without;
  d->log = log;
  if (listening == NULL)
    listening = g_ptr_array_new ();
  g_ptr_array_add (listening, d);
  subscribe (d);
}

unsigned
dead_slots_wanted (const struct dead_slots *d, unsigned n)
{
  return d->lost ? n : MIN (d->count, n);
}

void
dead_slots_forget (struct dead_slots *d)
{
  d->count = 0;
  d->lost = FALSE;
}

void
dead_slots_close (struct dead_slots *d)
{
  if (listening == NULL || !g_ptr_array_remove (listening, d))
    return;
  if (listening->len == 0)
    unsubscribe ();
}
