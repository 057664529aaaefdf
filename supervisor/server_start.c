/* A server started without holding up the main loop (server_start.h).
 *
 * The thread only waits (mloop_server_await: the pid file, the child's
 * exit, the timeout) on copies of what it needs; everything else, the
 * registry of children waited for and the queue included, is touched on
 * the main context only, so nothing here needs a lock.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "on_context.h"
#include "say.h"
#include "server_start.h"

#define STOP_TIMEOUT_MS 10000
/* Spawned at once at most: 2 x the CPUs we may run on, at least this. */
#define SPAWNED_MIN 4

struct server_start {
  /* What the spawn and the thread read: its own copies (a queued start
   * spawns after its caller's spec is gone).
   */
  struct mloop_server_spec spec;
  char *image, *overlay, *lock_record, *socket_path, *pid_file, *log_file,
    *stats_file;
  pid_t child;
  /* Main context only: CHILD's pidfd (-1 when adopted or without
   * pidfds), to kill it by, never another process that got its pid
   * once the thread reaped it; the start's record (server_start_left),
   * or NULL.
   */
  int pidfd;
  char *record;
  unsigned timeout_ms;
  /* What the thread writes, read once it has ended. */
  pid_t pid;
  char err[1024];
  /* Main context only. */
  GMainContext *context;
  server_started_fn done;
  void *data;
  bool abandoned, keep_serving;
  bool spawned;                 /* counted in SPAWNED */
};

/* Children a start waits for: pid -> the start. */
static GHashTable *awaited;
/* Starts under way, queued ones included; those that spawned a server
 * not yet ended; those waiting their turn, first come first.
 */
static unsigned pending, spawned;
static GQueue queue = G_QUEUE_INIT;

static void
start_free (struct server_start *s)
{
  if (s->pidfd != -1)
    close (s->pidfd);
  if (s->record)
    g_unlink (s->record);
  g_free (s->record);
  g_free (s->image);
  g_free (s->overlay);
  g_free (s->lock_record);
  g_free (s->socket_path);
  g_free (s->pid_file);
  g_free (s->log_file);
  g_free (s->stats_file);
  g_main_context_unref (s->context);
  g_free (s);
}

/* How many servers may be spawned and not yet listening at once.  Each
 * loads its image, nbdkit its plugins, an RBD image its cluster
 * connection: a boot attaching every device, or a takeover restarting
 * every server that died, would do all of it at once.
 */
static unsigned
spawn_cap (void)
{
  return MAX (SPAWNED_MIN, 2 * g_get_num_processors ());
}

static void launch_queued (void);

/* On the main context, once the thread has ended. */
static gboolean
deliver (gpointer data)
{
  struct server_start *s = data;

  if (s->child > 0)
    g_hash_table_remove (awaited, GINT_TO_POINTER (s->child));
  pending--;
  if (s->spawned)
    spawned--;
  /* Ended: the server listens (its pid file names it) or was reaped. */
  if (s->record)
    g_unlink (s->record);
  g_clear_pointer (&s->record, g_free);
  if (!s->abandoned)
    s->done (s->pid, s->pid > 0 ? NULL : s->err, s->data);
  else if (s->pid > 0 && !s->keep_serving) {
    mloop_server_stop (s->pid, s->socket_path, STOP_TIMEOUT_MS);
    waitpid (s->pid, NULL, WNOHANG);
  }
  start_free (s);
  launch_queued ();
  return G_SOURCE_REMOVE;
}

/* S's outcome, delivered from its context's loop: never inside the
 * call that failed it, nor on the thread that waited (on_context.h).
 */
static void
deliver_soon (struct server_start *s)
{
  on_context_soon (s->context, deliver, s);
}

/* S ends, failed with ERR, without a thread. */
static void
deliver_failure (struct server_start *s, const char *err)
{
  s->pid = 0;
  snprintf (s->err, sizeof s->err, "%s", err);
  deliver_soon (s);
}

static gpointer
await_server (gpointer data)
{
  struct server_start *s = data;

  if (mloop_server_await (&s->spec, s->child, s->timeout_ms, &s->pid,
                          s->err, sizeof s->err) == -1)
    s->pid = 0;
  deliver_soon (s);
  return NULL;
}

static char *
record_path (const char *pid_file)
{
  return g_strconcat (pid_file, ".starting", NULL);
}

/* Names CHILD, just spawned to write PID_FILE, in the start's record:
 * until it listens, nothing else in the device's directory names it.
 * Written by rename, so a record is whole or absent.  The record's path,
 * or NULL when it could not be written (said: a start still goes on).
 */
static char *
record_start (const char *pid_file, pid_t child)
{
  g_autofree char *text = g_strdup_printf ("%d\n", (int) child);
  g_autoptr (GError) gerr = NULL;
  char *path = record_path (pid_file);

  if (!g_file_set_contents (path, text, -1, &gerr)) {
    say ("cannot record the server starting: %s", gerr->message);
    g_free (path);
    return NULL;
  }
  return path;
}

/* Spawns S's server (unless adopted) and waits for it on a thread of
 * its own: the start timeout counts from here.  0, or -1 with ERR, the
 * child killed and reaped.
 */
static int
launch (struct server_start *s, char *err, size_t errlen)
{
  g_autoptr (GError) gerr = NULL;
  GThread *thread;

  if (s->child <= 0) {
    if (mloop_server_spawn (&s->spec, &s->child, err, errlen) == -1) {
      s->child = 0;
      return -1;
    }
    s->pidfd = (int) syscall (SYS_pidfd_open, s->child, 0);
    s->record = record_start (s->spec.pid_file, s->child);
    s->spawned = true;
    spawned++;
  }
  if (awaited == NULL)
    awaited = g_hash_table_new (NULL, NULL);
  g_hash_table_insert (awaited, GINT_TO_POINTER (s->child), s);
  /* A thread per start, not a pool: a pool's few threads, each held by
   * a server that never listens, would hold up every other start.
   */
  thread = g_thread_try_new ("server-start", await_server, s, &gerr);
  if (thread == NULL) {
    snprintf (err, errlen, "cannot wait for the server: %s", gerr->message);
    kill (s->child, SIGKILL);
    waitpid (s->child, NULL, 0);
    g_hash_table_remove (awaited, GINT_TO_POINTER (s->child));
    s->child = 0;
    if (s->spawned)
      spawned--;
    s->spawned = false;
    return -1;
  }
  g_thread_unref (thread);
  return 0;
}

/* Spawns the queued starts that fit under the cap, in turn. */
static void
launch_queued (void)
{
  char err[1024];

  while (spawned < spawn_cap () && !g_queue_is_empty (&queue)) {
    struct server_start *s = g_queue_pop_head (&queue);

    if (launch (s, err, sizeof err) == -1)
      deliver_failure (s, err);
  }
}

struct server_start *
server_start_begin (const struct mloop_server_spec *spec, pid_t adopted,
                    unsigned timeout_ms, server_started_fn done, void *data,
                    char *err, size_t errlen)
{
  struct server_start *s = g_new0 (struct server_start, 1);

  s->child = adopted;
  s->pidfd = -1;
  s->image = g_strdup (spec->image);
  s->overlay = g_strdup (spec->overlay);
  s->lock_record = g_strdup (spec->lock_record);
  s->socket_path = g_strdup (spec->socket_path);
  s->pid_file = g_strdup (spec->pid_file);
  s->log_file = g_strdup (spec->log_file);
  s->stats_file = g_strdup (spec->stats_file);
  s->spec = *spec;
  s->spec.image = s->image;
  s->spec.overlay = s->overlay;
  s->spec.lock_record = s->lock_record;
  s->spec.socket_path = s->socket_path;
  s->spec.pid_file = s->pid_file;
  s->spec.log_file = s->log_file;
  s->spec.stats_file = s->stats_file;
  s->timeout_ms = timeout_ms;
  s->context = g_main_context_ref_thread_default ();
  s->done = done;
  s->data = data;
  /* Past the cap, or behind others waiting: its turn comes as a server
   * spawned before it listens or fails (deliver).  An adopted child is
   * spawned already.
   */
  if (adopted <= 0 && (spawned >= spawn_cap () ||
                       !g_queue_is_empty (&queue))) {
    g_queue_push_tail (&queue, s);
    pending++;
    return s;
  }
  if (launch (s, err, errlen) == -1) {
    start_free (s);
    return NULL;
  }
  pending++;
  return s;
}

void
server_start_abandon (struct server_start *s, bool keep_serving)
{
  /* Not spawned yet: nothing to serve, nor to stop. */
  if (g_queue_remove (&queue, s)) {
    pending--;
    start_free (s);
    return;
  }
  s->abandoned = true;
  s->keep_serving = keep_serving;
}

void
server_start_kill (struct server_start *s)
{
  struct pollfd gone = { .fd = s->pidfd, .events = POLLIN };

  if (g_queue_remove (&queue, s)) {
    pending--;
    start_free (s);
    return;
  }
  s->abandoned = true;
  s->keep_serving = false;
  /* Spawned by us, its pidfd names it even once the thread reaped it
   * (the signal then fails: nothing to wait for).
   */
  if (s->pidfd != -1 &&
      syscall (SYS_pidfd_send_signal, s->pidfd, SIGKILL, NULL, 0) == 0)
    while (poll (&gone, 1, -1) == -1 && errno == EINTR)
      ;
}

bool
server_start_awaits (pid_t pid)
{
  return awaited && g_hash_table_contains (awaited, GINT_TO_POINTER (pid));
}

unsigned
server_starts_pending (void)
{
  return pending;
}

pid_t
server_start_left (const char *pid_file)
{
  g_autofree char *path = record_path (pid_file);
  g_autofree char *text = NULL;

  if (!g_file_get_contents (path, &text, NULL, NULL))
    return 0;
  return (pid_t) MAX (atoi (text), 0);
}

void
server_start_forget (const char *pid_file)
{
  g_autofree char *path = record_path (pid_file);

  g_unlink (path);
}

void
server_starts_kill (void)
{
  GHashTableIter i;
  gpointer s;

  /* Those queued first, lest the kills below make room for them. */
  while ((s = g_queue_pop_head (&queue)) != NULL)
    deliver_failure (s, "not started: the process is stopping");
  if (awaited == NULL)
    return;
  g_hash_table_iter_init (&i, awaited);
  while (g_hash_table_iter_next (&i, NULL, &s))
    if (((struct server_start *) s)->pidfd != -1)
      syscall (SYS_pidfd_send_signal, ((struct server_start *) s)->pidfd,
               SIGKILL, NULL, 0);
}
