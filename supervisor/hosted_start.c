/* A hosted server opened on a thread (hosted_start.h). */
#include <stdio.h>

#include <glib.h>

#include "hosted_start.h"
#include "on_context.h"
#include "say.h"

struct hosted_start {
  hosted_started_fn done;       /* NULL once abandoned */
  void *data;
  char *image, *overlay, *lock_record, *socket_path, *stats_file;
  struct hosted_server_config config;
  struct hosted_server *server;
  char err[1024];
  GMainContext *context;        /* where DONE is called */
};

static void
start_free (struct hosted_start *s)
{
  g_free (s->image);
  g_free (s->overlay);
  g_free (s->lock_record);
  g_free (s->socket_path);
  g_free (s->stats_file);
  g_free (s);
}

/* What the store and the open say (O_DIRECT refused, a lock broken)
 * goes to mloopd's log: the engine's notices carry no device.
 */
static void
say_line (const char *line)
{
  say ("hosted server: %s", line);
}

/* Back on the main context the open was begun from. */
static gboolean
opened (gpointer data)
{
  struct hosted_start *s = data;

  if (s->done)
    s->done (s->server, s->server ? NULL : s->err, s->data);
  else if (s->server)
    hosted_server_close (s->server);
  g_main_context_unref (s->context);
  start_free (s);
  return G_SOURCE_REMOVE;
}

static gpointer
open_on_thread (gpointer data)
{
  struct hosted_start *s = data;

  s->server = hosted_server_open (&s->config, s->err, sizeof s->err);
  /* Queued, never called on this thread (on_context.h). */
  on_context_soon (s->context, opened, s);
  return NULL;
}

struct hosted_start *
hosted_start_begin (const struct mloop_server_spec *spec,
                    hosted_started_fn done, void *data)
{
  struct hosted_start *s = g_new0 (struct hosted_start, 1);
  struct mloop_engine_config *e = &s->config.engine;

  s->done = done;
  s->data = data;
  s->image = g_strdup (spec->image);
  s->overlay = g_strdup (spec->overlay);
  s->lock_record = g_strdup (spec->lock_record);
  s->socket_path = g_strdup (spec->socket_path);
  s->stats_file = g_strdup (spec->stats_file);
  mloop_engine_config_init (e);
  e->path = s->image;
  e->want_write = !spec->read_only;
  e->window.offset = spec->offset;
  e->window.sizelimit = spec->sizelimit;
  e->overlay = s->overlay;
  e->overlay_must_exist = spec->overlay_must_exist;
  e->lock_record = s->lock_record;
  e->io_timeout = spec->io_timeout;
  e->notice = say_line;
  s->config.read_only = spec->read_only;
  s->config.threads = spec->threads;
  s->config.socket_path = s->socket_path;
  s->config.stats_file = s->stats_file;
  s->config.warn = say_line;
  s->context = g_main_context_ref_thread_default ();
  g_thread_unref (g_thread_new ("hosted-open", open_on_thread, s));
  return s;
}

void
hosted_start_abandon (struct hosted_start *s)
{
  s->done = NULL;
}
