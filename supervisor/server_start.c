/* A server started without holding up the main loop (server_start.h).
 *
 * The thread only waits (mloop_server_await: the pid file, the child's
 * exit, the timeout) on copies of what it needs; everything else, the
 * registry of children waited for included, is touched on the main
 * context only, so nothing here needs a lock.
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

#include "say.h"
#include "server_start.h"

#define STOP_TIMEOUT_MS 10000

struct server_start {
  /* What the thread reads: its own copies. */
  struct mloop_server_spec spec;
  char *pid_file, *log_file, *socket_path;
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
};

/* Children a start waits for: pid -> the start. */
static GHashTable *awaited;
static unsigned pending;

static void
start_free (struct server_start *s)
{
  if (s->pidfd != -1)
    close (s->pidfd);
  if (s->record)
    g_unlink (s->record);
  g_free (s->record);
  g_free (s->pid_file);
  g_free (s->log_file);
  g_free (s->socket_path);
  g_main_context_unref (s->context);
  g_free (s);
}

/* On the main context, once the thread has ended. */
static gboolean
deliver (gpointer data)
{
  struct server_start *s = data;

  g_hash_table_remove (awaited, GINT_TO_POINTER (s->child));
  pending--;
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
  return G_SOURCE_REMOVE;
}

static gpointer
await_server (gpointer data)
{
  struct server_start *s = data;

  if (mloop_server_await (&s->spec, s->child, s->timeout_ms, &s->pid,
                          s->err, sizeof s->err) == -1)
    s->pid = 0;
  g_main_context_invoke (s->context, deliver, s);
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

struct server_start *
server_start_begin (const struct mloop_server_spec *spec, pid_t adopted,
                    unsigned timeout_ms, server_started_fn done, void *data,
                    char *err, size_t errlen)
{
  struct server_start *s = g_new0 (struct server_start, 1);
  g_autoptr (GError) gerr = NULL;
  GThread *thread;

  s->child = adopted;
  s->pidfd = -1;
  if (adopted <= 0) {
    if (mloop_server_spawn (spec, &s->child, err, errlen) == -1) {
      g_free (s);
      return NULL;
    }
    s->pidfd = (int) syscall (SYS_pidfd_open, s->child, 0);
    s->record = record_start (spec->pid_file, s->child);
  }
  s->pid_file = g_strdup (spec->pid_file);
  s->log_file = g_strdup (spec->log_file);
  s->socket_path = g_strdup (spec->socket_path);
  s->spec = (struct mloop_server_spec) {
    .kind = spec->kind, .pid_file = s->pid_file, .log_file = s->log_file,
    .socket_path = s->socket_path,
  };
  s->timeout_ms = timeout_ms;
  s->context = g_main_context_ref_thread_default ();
  s->done = done;
  s->data = data;
  if (awaited == NULL)
    awaited = g_hash_table_new (NULL, NULL);
  g_hash_table_insert (awaited, GINT_TO_POINTER (s->child), s);
  pending++;
  /* A thread per start, not a pool: a pool's few threads, each held by
   * a server that never listens, would hold up every other start.
   */
  thread = g_thread_try_new ("server-start", await_server, s, &gerr);
  if (thread == NULL) {
    snprintf (err, errlen, "cannot wait for the server: %s", gerr->message);
    kill (s->child, SIGKILL);
    waitpid (s->child, NULL, 0);
    g_hash_table_remove (awaited, GINT_TO_POINTER (s->child));
    pending--;
    start_free (s);
    return NULL;
  }
  g_thread_unref (thread);
  return s;
}

void
server_start_abandon (struct server_start *s, bool keep_serving)
{
  s->abandoned = true;
  s->keep_serving = keep_serving;
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

  if (awaited == NULL)
    return;
  g_hash_table_iter_init (&i, awaited);
  while (g_hash_table_iter_next (&i, NULL, &s))
    if (((struct server_start *) s)->pidfd != -1)
      syscall (SYS_pidfd_send_signal, ((struct server_start *) s)->pidfd,
               SIGKILL, NULL, 0);
}
