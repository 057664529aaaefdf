/* mloop — the descriptors callers pass mloop's D-Bus service, and how
 * they are closed (descriptors.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <gio/gunixfdlist.h>

#include "descriptors.h"

/* What interrupts a close that waits: ignored by default, so one sent
 * by anyone else before the handler is set does nothing.
 */
#define INTERRUPT_SIGNAL SIGURG

/* A message's descriptors, kept on it (quark "mloop-descriptors"). */
struct carried {
  int n;
  int *fds;
};

static GQuark carried_quark;

/* The closers.  LOCK guards all of it. */
static GMutex lock;
/* Descriptors waiting for a closer, oldest first (GINT_TO_POINTER). */
static GQueue waiting = G_QUEUE_INIT;

struct closer {
  bool alive;                   /* a thread runs in this slot */
  pthread_t thread;
  gint64 since;                 /* when its close began; 0: between two */
};

static struct closer closers[MLOOP_MAX_CLOSERS];
static unsigned alive;
/* The main loop's watch over the closes in progress, while any are. */
static guint watch;
/* When the log last said every closer waits (monotonic, µs). */
static gint64 said_all_waiting;

static void
interrupted (int sig)
{
  (void) sig;
}

static gpointer
closer_run (gpointer data)
{
  struct closer *self = data;
  sigset_t interrupt;

  /* A thread starts with its creator's signal mask, and the process
   * with whatever its starter left it across exec: blocked here, the
   * watch's signal would stay pending and cut no close short.
   */
  sigemptyset (&interrupt);
  sigaddset (&interrupt, INTERRUPT_SIGNAL);
  pthread_sigmask (SIG_UNBLOCK, &interrupt, NULL);
  g_mutex_lock (&lock);
  self->thread = pthread_self ();
  while (!g_queue_is_empty (&waiting)) {
    int fd = GPOINTER_TO_INT (g_queue_pop_head (&waiting));

    self->since = g_get_monotonic_time ();
    g_mutex_unlock (&lock);
    close (fd);
    g_mutex_lock (&lock);
    self->since = 0;
  }
  /* Past this, the watch signals this thread no more. */
  self->alive = false;
  alive--;
  g_mutex_unlock (&lock);
  return NULL;
}

/* One more closer, if there is room for one and a thread to be had
 * (else the descriptors wait for a closer that is, or for the watch's
 * next try).  LOCK held.
 */
static void
start_closer_locked (void)
{
  g_autoptr (GError) gerr = NULL;
  GThread *t;
  unsigned i;

  if (alive >= MLOOP_MAX_CLOSERS)
    return;
  for (i = 0; closers[i].alive; i++)
    ;
  closers[i] = (struct closer) { .alive = true };
  t = g_thread_try_new ("mloop-close", closer_run, &closers[i], &gerr);
  if (t == NULL) {
    closers[i].alive = false;
    return;
  }
  g_thread_unref (t);
  alive++;
}

/* Every second while closes are in progress or waiting, in the main
 * thread: each close waiting MLOOP_CLOSE_INTERRUPT_S or more is
 * interrupted (the signal stays pending through an uninterruptible
 * wait, and does no harm: each second again until it ends).
 */
static gboolean
watch_closes (gpointer unused)
{
  const gint64 now = g_get_monotonic_time ();
  unsigned long queued;
  unsigned late = 0;

  g_mutex_lock (&lock);
  for (unsigned i = 0; i < MLOOP_MAX_CLOSERS; i++)
    if (closers[i].alive && closers[i].since != 0 &&
        now - closers[i].since >= MLOOP_CLOSE_INTERRUPT_S * G_USEC_PER_SEC) {
      pthread_kill (closers[i].thread, INTERRUPT_SIGNAL);
      late++;
    }
  queued = g_queue_get_length (&waiting);
  /* Room for a closer, and descriptors waiting: no thread could be had
   * when they came.
   */
  if (queued > 0)
    start_closer_locked ();
  if (late == MLOOP_MAX_CLOSERS && queued > 0 &&
      (said_all_waiting == 0 || now - said_all_waiting >= 60 * G_USEC_PER_SEC)) {
    said_all_waiting = now;
    g_message ("every closer (%d) waits on a descriptor a caller passed "
               "that does not close (a user's FUSE server that does not "
               "answer?): %lu more wait, open, for one to end",
               MLOOP_MAX_CLOSERS, queued);
  }
  if (alive == 0 && g_queue_is_empty (&waiting)) {
    watch = 0;
    g_mutex_unlock (&lock);
    return G_SOURCE_REMOVE;
  }
  g_mutex_unlock (&lock);
  return G_SOURCE_CONTINUE;
}

void
mloop_descriptors_close (int fd)
{
  if (fd < 0)
    return;
  g_mutex_lock (&lock);
  g_queue_push_tail (&waiting, GINT_TO_POINTER (fd));
  start_closer_locked ();
  if (watch == 0)
    watch = g_timeout_add_seconds (1, watch_closes, NULL);
  g_mutex_unlock (&lock);
}

static void
carried_free (gpointer data)
{
  struct carried *c = data;

  for (int i = 0; i < c->n; i++)
    mloop_descriptors_close (c->fds[i]);
  g_free (c->fds);
  g_free (c);
}

/* In GDBus's worker thread, for every message received (INCOMING) and
 * sent: its descriptors out of its list, into CARRIED on it.  The
 * message is locked, its list is not, and GDBus looks only at the list.
 */
static GDBusMessage *
take_descriptors (GDBusConnection *connection, GDBusMessage *message,
                  gboolean incoming, gpointer unused)
{
  GUnixFDList *list;
  struct carried *c;

  if (!incoming || (list = g_dbus_message_get_unix_fd_list (message)) == NULL ||
      g_unix_fd_list_get_length (list) == 0)
    return message;
  c = g_new (struct carried, 1);
  c->fds = g_unix_fd_list_steal_fds (list, &c->n);
  g_object_set_qdata_full (G_OBJECT (message), carried_quark, c,
                           carried_free);
  return message;
}

void
mloop_descriptors_take (GDBusConnection *connection)
{
  struct sigaction sa = { .sa_handler = interrupted, .sa_flags = SA_RESTART };

  sigemptyset (&sa.sa_mask);
  sigaction (INTERRUPT_SIGNAL, &sa, NULL);
  carried_quark = g_quark_from_static_string ("mloop-descriptors");
  g_dbus_connection_add_filter (connection, take_descriptors, NULL, NULL);
}

int
mloop_descriptors_count (GDBusMessage *message)
{
  const struct carried *c = g_object_get_qdata (G_OBJECT (message),
                                                carried_quark);

  return c ? c->n : 0;
}

int
mloop_descriptors_dup (GDBusMessage *message, int index)
{
  const struct carried *c = g_object_get_qdata (G_OBJECT (message),
                                                carried_quark);

  if (c == NULL || index < 0 || index >= c->n) {
    errno = EBADF;
    return -1;
  }
  return fcntl (c->fds[index], F_DUPFD_CLOEXEC, 3);
}
