/* mloop-supervisor — the device's dead connection slots (dead_slots.h). */
#include <glib-unix.h>

#include "dead_slots.h"
#include "nbd_events.h"
#include "say.h"

static gboolean on_nbd_event (gint fd, GIOCondition c, gpointer data);

static void
subscribe (struct dead_slots *d)
{
  char err[512];

  d->events = mloop_nbd_events_open (err, sizeof err);
  if (d->events == NULL) {
    say_to (d->log, "%s; %s", err, d->without);
    d->source = 0;
    return;
  }
  d->source = g_unix_fd_add (mloop_nbd_events_fd (d->events), G_IO_IN,
                             on_nbd_event, d);
}

static gboolean
on_nbd_event (gint fd, GIOCondition c, gpointer data)
{
  struct dead_slots *d = data;
  char err[512];
  bool lost = false;
  gboolean keep = G_SOURCE_CONTINUE;
  int index = d->device_index (d->data);

  if (mloop_nbd_events_read (d->events, index, &d->count, &lost,
                             err, sizeof err) == -1) {
    say_to (d->log, "%s; listening again", err);
    mloop_nbd_events_close (d->events);
    subscribe (d);
    lost = true;
    keep = G_SOURCE_REMOVE;
  }
  if (lost && index >= 0) {
    say_to (d->log, "/dev/nbd%d: some of the kernel's announcements of "
            "dropped connections were lost; offering connections until it "
            "has no dead one", index);
    d->lost = TRUE;
  }
  if (d->count > 0 || d->lost)
    d->heal_soon (d->data);
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
  if (d->source != 0)
    g_source_remove (d->source);
  d->source = 0;
  mloop_nbd_events_close (d->events);
  d->events = NULL;
}
