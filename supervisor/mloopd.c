/* mloopd — the resident service that keeps local devices' servers.
 *
 * One process holds a keeper (keeper.h) per device: it starts the
 * device's server, restarts it when it dies and hands the kernel new
 * connections, heals dropped connections, follows an RBD image's size
 * and notices autoclear, as a mloop-supervisor does for one device, on
 * one main loop for all of them.  A remote export's device has a remote
 * keeper (remote.h), which only heals.
 *
 * It is asked over its control socket (control/message.h: one datagram
 * per request and answer), by root only: a request names an image root
 * may open, a server command run as root.
 *
 *   op=keep dir=DIR server=native|nbdkit image=IMAGE [overlay=FILE]
 *           [offset=N] [sizelimit=N] [threads=N] [read-only=1]
 *           [io-timeout=S] [connections=N]
 *       starts the device's server and keeps it; answers server-pid=N
 *       once it listens.  Served inside mloopd (--serve=in-process),
 *       the answer adds in-process=1 and, for connections=N (1..16), N
 *       connections in transmission already (no handshake) and what a
 *       handshake would have said: size, flags, min-block,
 *       preferred-block, max-block.  DIR holds the device's state, or
 *       its attach holds DIR's lock (drop_if_attach_died)
 *   op=keep dir=DIR remote=URI
 *       keeps a remote export's device (remote.h): no server of ours,
 *       the connections the kernel drops connected again
 *   op=restart dir=DIR   a planned restart of the device's server
 *   op=drop dir=DIR      stops the server and forgets the device
 *   op=has dir=DIR       ok=1 when the device is kept here
 *   op=list              answers dirs=DIR\nDIR...
 *
 * Every answer has ok=1, or error=WHY (one line).  DIR is a device's
 * directory under mloop's runtime directory (device_state.h).
 *
 * What it keeps survives it: each device's request is recorded in its
 * directory (keep_record.h), SIGTERM lets go of the keepers and leaves
 * the servers serving, and the next mloopd (systemd restarts it after a
 * crash or an upgrade) takes every recorded device over, its running
 * server or a new one.
 *
 *   mloopd [--control PATH] [--stop-wait S] [--serve process|in-process]
 *
 * The socket is PATH (default RUNTIME_DIR/mloopd.sock), or the one
 * systemd passes (socket activation: LISTEN_FDS=1, descriptor 3).  A
 * stop waits up to S seconds (STOP_WAIT_S) for the servers starting.
 * With --serve=in-process a native server is served inside mloopd
 * (server/hosted_server.h): no process per device, and an attach that
 * starts no program; such a device's server ends with mloopd, and the
 * next mloopd opens its image again and hands the kernel new
 * connections.  A device keeps where it was served from its keep to its
 * drop, whatever the next mloopd is told.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <glib.h>
#include <glib-unix.h>
#include <glib/gstdio.h>

#include "device_state.h"
#include "keep_record.h"
#include "keeper.h"
#include "message.h"
#include "remote.h"
#include "resident_service.h"
#include "say.h"
#include "server_kind.h"
#include "server_start.h"

#define SD_LISTEN_FDS_START 3
/* Out of descriptors: how long the listener rests before it tries
 * again (on_connect).
 */
#define ACCEPT_RETRY_MS 250
#define STRAY_REAP_S 2
/* How often the devices whose attach has not made them yet are looked
 * at (drop_if_attach_died).
 */
#define ATTACH_CHECK_S 2
/* How long a stop may wait for the starts under way (--stop-wait):
 * systemd kills mloopd at its unit's TimeoutStopSec (90 s,
 * systemd/mloopd.service.in), which this and STOP_KILL_WAIT_S, and a
 * planned restart's next server being stopped when the deadline comes
 * (keeper.c, STOP_TIMEOUT_MS: 10 s) must fit in.
 */
#define STOP_WAIT_S 60
/* At the deadline the servers still starting are killed: how long
 * their starts are given to see them die and reap them.
 */
#define STOP_KILL_WAIT_S 2

/* One device kept. */
struct kept {
  char *dir;
  struct keeper *k;             /* a local image's server's, or NULL */
  struct remote_keeper *rk;     /* a remote export's device's, or NULL */
  FILE *log;                    /* the directory's supervisor.log */
  /* The client waiting for the answer to its keep while the first server
   * starts, or -1.
   */
  int waiting;
  unsigned serial;              /* tells this keep from a later one of DIR */
  /* The device's state was seen: its attach made it (drop_if_attach_died
   * looks no more).
   */
  bool made;
  /* The keep's connections=N: served inside mloopd, the answer brings N
   * connections that need no handshake.  0: none asked.
   */
  unsigned connections;
};

static GHashTable *kept;        /* dir -> struct kept */
static unsigned kept_serial;
static GMainLoop *loop;
/* Stopping: the keepers are let go (or about to be); clients' requests
 * are refused.
 */
static bool stopping;
/* --serve=in-process: a native server is served inside mloopd
 * (server/hosted_server.h), not by a mloop-server process of its own.
 */
static bool serve_in_process;

static void
kept_free (gpointer data)
{
  struct kept *d = data;

  if (d->log)
    fclose (d->log);
  g_free (d->dir);
  g_free (d);
}

/* Stops D's keeper: its server with it. */
static void
kept_stop (struct kept *d)
{
  if (d->k)
    keeper_stop (d->k);
  else
    remote_keeper_stop (d->rk);
}

/* Stops D's keeper, leaving its server serving (a remote device has
 * none: the kernel's connections stay), for the next mloopd.
 */
static void
kept_let_go (struct kept *d)
{
  if (d->k)
    keeper_let_go (d->k);
  else
    remote_keeper_stop (d->rk);
}

/* A device the kernel let go (autoclear), named by its directory and
 * keep: by the time the idle runs, it may have been dropped, let go or
 * kept anew.
 */
struct released {
  char *dir;
  unsigned serial;
};

static void
released_free (gpointer data)
{
  struct released *r = data;

  g_free (r->dir);
  g_free (r);
}

/* An autoclear device let go by the kernel: stopped from the loop, not
 * inside the keeper's call.
 */
static gboolean
stop_released (gpointer data)
{
  struct released *r = data;
  struct kept *d = g_hash_table_lookup (kept, r->dir);

  if (d == NULL || d->serial != r->serial)
    return G_SOURCE_REMOVE;
  keep_record_remove (d->dir);
  kept_stop (d);
  g_hash_table_remove (kept, d->dir);
  return G_SOURCE_REMOVE;
}

static void
stop_released_soon (const struct kept *d)
{
  struct released *r = g_new (struct released, 1);

  r->dir = g_strdup (d->dir);
  r->serial = d->serial;
  g_idle_add_full (G_PRIORITY_DEFAULT_IDLE, stop_released, r, released_free);
}

static void
on_released (struct keeper *k, void *data)
{
  stop_released_soon (data);
}

static void
on_remote_released (struct remote_keeper *rk, void *data)
{
  stop_released_soon (data);
}

/* Whether DIR is a device's directory in mloop's runtime directory:
 * one level below, a directory, and spelled as mloop spells it (the
 * runtime directory, one slash, the name: no "." or "..", no doubled or
 * trailing slash), so that one directory is one key of the kept table.
 */
static bool
device_dir (const char *dir, char *err, size_t errlen)
{
  g_autofree char *base = g_path_get_basename (dir);
  g_autofree char *canonical = g_build_filename (mloop_runtime_dir (), base,
                                                 NULL);
  struct stat st;

  if (strcmp (dir, canonical) || strcmp (base, ".") == 0 ||
      strcmp (base, "..") == 0 || strchr (base, '/') ||
      lstat (dir, &st) == -1 || !S_ISDIR (st.st_mode)) {
    snprintf (err, errlen, "%s is not a device's directory in %s (spelled "
              "%s/NAME)", dir, mloop_runtime_dir (), mloop_runtime_dir ());
    return false;
  }
  return true;
}

/* A device kept for DIR, its log opened, no keeper yet.  NULL with ERR. */
static struct kept *
kept_alloc (const char *dir, char *err, size_t errlen)
{
  g_autofree char *log_path = g_build_filename (dir, MLOOP_DIR_SUPERVISOR_LOG,
                                                NULL);
  struct kept *d = g_new0 (struct kept, 1);

  d->log = fopen (log_path, "ae");
  if (d->log == NULL) {
    snprintf (err, errlen, "cannot open %s: %s", log_path, strerror (errno));
    g_free (d);
    return NULL;
  }
  d->dir = g_strdup (dir);
  d->waiting = -1;
  d->serial = ++kept_serial;
  return d;
}

/* A keeper for DIR with SPEC's server (its strings copied): its log
 * opened, not yet started.  NULL with ERR.
 */
static struct kept *
kept_new (const char *dir, const struct mloop_server_spec *spec, char *err,
          size_t errlen)
{
  struct keeper_config config = {
    .dir = dir, .server = *spec, .released = on_released,
  };
  struct kept *d = kept_alloc (dir, err, errlen);

  if (d == NULL)
    return NULL;
  config.log = d->log;
  config.data = d;
  d->k = keeper_new (&config);
  return d;
}

/* A remote export's device in DIR, kept from now on (remote.h).  NULL
 * with ERR.
 */
static struct kept *
kept_new_remote (const char *dir, const char *uri, char *err, size_t errlen)
{
  struct kept *d = kept_alloc (dir, err, errlen);

  if (d == NULL)
    return NULL;
  d->rk = remote_keeper_new (dir, uri, d->log, on_remote_released, d, err,
                             errlen);
  if (d->rk == NULL) {
    kept_free (d);
    return NULL;
  }
  return d;
}

/* op=keep: SPEC from the request's fields. */
static bool
read_spec (const struct mloop_control_in *in, struct mloop_server_spec *spec,
           char *err, size_t errlen)
{
  const char *kind = mloop_control_get (in, "server");
  const char *threads = mloop_control_get (in, "threads");
  const char *offset = mloop_control_get (in, "offset");
  const char *sizelimit = mloop_control_get (in, "sizelimit");
  const char *read_only = mloop_control_get (in, "read-only");
  const char *io_timeout = mloop_control_get (in, "io-timeout");
  guint64 n;

  *spec = (struct mloop_server_spec) { 0 };
  spec->kind = kind ? mloop_server_kind_find (kind, err, errlen)
    : mloop_server_kind_default ();
  if (spec->kind == NULL)
    return false;
  spec->image = mloop_control_get (in, "image");
  spec->overlay = mloop_control_get (in, "overlay");
  if (spec->image == NULL || *spec->image == '\0') {
    snprintf (err, errlen, "keep: no image");
    return false;
  }
#define NUMBER(field, text, max)                                        \
  if (text) {                                                           \
    if (!g_ascii_string_to_unsigned (text, 10, 0, max, &n, NULL)) {     \
      snprintf (err, errlen, "keep: %s=%s is not a number up to %llu", \
                #field, text, (unsigned long long) (max));              \
      return false;                                                     \
    }                                                                   \
    spec->field = n;                                                    \
  }
  NUMBER (offset, offset, G_MAXUINT64);
  NUMBER (sizelimit, sizelimit, G_MAXUINT64);
  NUMBER (threads, threads, 1024);
  NUMBER (io_timeout, io_timeout, 86400);
#undef NUMBER
  spec->read_only = read_only && strcmp (read_only, "1") == 0;
  return true;
}

static gboolean on_request (gint sock, GIOCondition c, gpointer unused);

/* Sends OUT (with the N_FDS descriptors FDS) to a client whose answer
 * waited, and reads its next request.
 */
static void
answer_waiting_with (int sock, const struct mloop_control_out *out,
                     const int *fds, size_t n_fds)
{
  if (mloop_control_send (sock, out, fds, n_fds) == -1) {
    close (sock);
    return;
  }
  g_unix_fd_add (sock, G_IO_IN | G_IO_HUP | G_IO_ERR, on_request, NULL);
}

static void
answer_waiting (int sock, const struct mloop_control_out *out)
{
  answer_waiting_with (sock, out, NULL, 0);
}

/* A keep's answer for a device served inside mloopd, asked for N
 * connections: N that need no handshake in FDS, and what a handshake
 * would have said of the export in OUT (size, flags, block sizes).  The
 * number made (0 when they could not be: the attach then connects
 * through the socket, as to a server of its own).
 */
static unsigned
add_connections (struct kept *d, struct mloop_control_out *out, int *fds)
{
  struct mloop_nbd_export x;
  char err[512], n[32];

  if (keeper_connections (d->k, d->connections, fds, &x, err,
                          sizeof err) == -1) {
    say_to (d->log, "connections for the attach: %s; it connects through "
            "the socket", err);
    return 0;
  }
#define NUMBER(key, value)                                      \
  snprintf (n, sizeof n, "%llu", (unsigned long long) (value)); \
  mloop_control_add (out, key, n);
  NUMBER ("connections", d->connections);
  NUMBER ("size", x.size);
  NUMBER ("flags", x.flags);
  NUMBER ("min-block", x.min_block);
  NUMBER ("preferred-block", x.preferred_block);
  NUMBER ("max-block", x.max_block);
#undef NUMBER
  return d->connections;
}

/* A keep is asked by `mloop attach` between its claim and the device's
 * state, while it holds the directory's lock (device_state.h).  An
 * attach that died there (killed, crashed, its mloopd killed meanwhile)
 * leaves a device that does not exist: no state, and nobody holding the
 * lock.  Then D (its directory gone too) is forgotten, its server
 * stopped, a keep still waiting for its server answered, and true is
 * returned: the caller takes D out of the table.  The directory is left
 * as any attach that died half-way leaves it, to `mloop detach --all`.
 * Looked at when taken over and every ATTACH_CHECK_S, until the state is
 * seen.
 */
static bool
drop_if_attach_died (struct kept *d)
{
  struct mloop_control_out out;
  int lock;

  if (d->made)
    return false;
  lock = mloop_state_lock_abandoned (d->dir);
  if (lock == -1 && errno == EEXIST)
    d->made = true;
  if (lock == -1 && errno != ENOENT)
    return false;
  say ("%s: its attach ended before it made the device: dropped", d->dir);
  keep_record_remove (d->dir);
  kept_stop (d);
  mloop_state_unlock (lock);
  if (d->waiting != -1) {
    mloop_control_out_init (&out);
    mloop_control_add (&out, "error", "no attach holds the device's "
                       "directory: dropped");
    answer_waiting (d->waiting, &out);
    d->waiting = -1;
  }
  return true;
}

static gboolean
check_attaches (gpointer unused)
{
  GHashTableIter i;
  gpointer d;

  /* Stopping: the next mloopd looks at them when it takes them over. */
  if (stopping)
    return G_SOURCE_CONTINUE;
  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, NULL, &d))
    if (drop_if_attach_died (d))
      g_hash_table_iter_remove (&i);
  return G_SOURCE_CONTINUE;
}

/* A keep's first server listens, or did not start. */
static void
on_kept (struct keeper *k, const char *start_err, void *data)
{
  struct kept *d = data;
  struct mloop_control_out out;
  int sock = d->waiting, fds[MLOOP_CONTROL_MAX_FDS];
  unsigned n_fds = 0;
  char pid[32];

  d->waiting = -1;
  mloop_control_out_init (&out);
  if (start_err) {
    keep_record_remove (d->dir);
    kept_stop (d);
    g_hash_table_remove (kept, d->dir);
    mloop_control_add (&out, "error", start_err);
  }
  else {
    snprintf (pid, sizeof pid, "%d", (int) keeper_server_pid (k));
    mloop_control_add (&out, "ok", "1");
    mloop_control_add (&out, "server-pid", pid);
    if (keeper_in_process (k))
      mloop_control_add (&out, "in-process", "1");
    if (keeper_in_process (k) && d->connections > 0)
      n_fds = add_connections (d, &out, fds);
  }
  answer_waiting_with (sock, &out, fds, n_fds);
  /* The attach has them (or, gone, the connections end with ours). */
  for (unsigned i = 0; i < n_fds; i++)
    close (fds[i]);
}

/* op=keep from the client on SOCK (an attach under way, its directory's
 * lock held, or a device made): answered in OUT at once when refused;
 * else (false) once the server listens (on_kept), the device kept from
 * now on, so that other requests are answered meanwhile.
 */
static bool
keep (const struct mloop_control_in *in, struct mloop_control_out *out,
      int sock)
{
  const char *dir = mloop_control_get (in, "dir");
  const char *remote = mloop_control_get (in, "remote");
  const char *connections_text = mloop_control_get (in, "connections");
  guint64 connections = 0;
  struct mloop_server_spec spec;
  struct kept *d;
  char err[1024];
  int lock;

  if (dir == NULL || !device_dir (dir, err, sizeof err) ||
      (!remote && !read_spec (in, &spec, err, sizeof err)))
    goto fail;
  if (g_hash_table_contains (kept, dir)) {
    snprintf (err, sizeof err, "%s is kept already", dir);
    goto fail;
  }
  if (connections_text &&
      !g_ascii_string_to_unsigned (connections_text, 10, 1,
                                   MLOOP_CONTROL_MAX_FDS, &connections,
                                   NULL)) {
    snprintf (err, sizeof err, "keep: connections=%s is not a number from "
              "1 to %d", connections_text, MLOOP_CONTROL_MAX_FDS);
    goto fail;
  }
  /* Asked by an attach under way, or for a device made: else nothing
   * would ever make it (drop_if_attach_died).
   */
  if ((lock = mloop_state_lock_abandoned (dir)) != -1) {
    mloop_state_unlock (lock);
    snprintf (err, sizeof err, "%s has no device's state, and no attach "
              "holds its lock", dir);
    goto fail;
  }
  if (remote) {
    if (keep_record_save_remote (dir, remote, err, sizeof err) == -1)
      goto fail;
    d = kept_new_remote (dir, remote, err, sizeof err);
    if (d == NULL) {
      keep_record_remove (dir);
      goto fail;
    }
    g_hash_table_insert (kept, d->dir, d);
    mloop_control_add (out, "ok", "1");
    return true;
  }
  /* nbdkit is a program of its own, always. */
  spec.in_process = serve_in_process &&
    strcmp (spec.kind->name, "native") == 0;
  if (keep_record_save (dir, &spec, err, sizeof err) == -1)
    goto fail;
  d = kept_new (dir, &spec, err, sizeof err);
  if (d == NULL) {
    keep_record_remove (dir);
    goto fail;
  }
  g_hash_table_insert (kept, d->dir, d);
  d->connections = connections;
  d->waiting = sock;
  keeper_start_async (d->k, on_kept, d);
  return false;
fail:
  mloop_control_add (out, "error", err);
  return true;
}

/* The device DIR names in IN, kept; else says why in OUT. */
static struct kept *
find_kept (const struct mloop_control_in *in, struct mloop_control_out *out)
{
  const char *dir = mloop_control_get (in, "dir");
  struct kept *d = dir ? g_hash_table_lookup (kept, dir) : NULL;
  char err[1024];

  if (d == NULL) {
    snprintf (err, sizeof err, "%s is not kept here", dir ? dir : "(no dir)");
    mloop_control_add (out, "error", err);
  }
  return d;
}

/* find_kept, for a request that needs its first server to have started. */
static struct kept *
find_started (const struct mloop_control_in *in, struct mloop_control_out *out)
{
  struct kept *d = find_kept (in, out);
  char err[1024];

  if (d && d->waiting != -1) {
    snprintf (err, sizeof err, "%s is still starting its server; try again "
              "once its keep is answered", d->dir);
    mloop_control_add (out, "error", err);
    return NULL;
  }
  return d;
}

static void
drop (const struct mloop_control_in *in, struct mloop_control_out *out)
{
  struct kept *d = find_started (in, out);

  if (d == NULL)
    return;
  keep_record_remove (d->dir);
  kept_stop (d);
  g_hash_table_remove (kept, d->dir);
  mloop_control_add (out, "ok", "1");
}

static void
restart (const struct mloop_control_in *in, struct mloop_control_out *out)
{
  struct kept *d = find_started (in, out);

  if (d == NULL)
    return;
  if (d->k == NULL) {
    mloop_control_add (out, "error", "a remote export's device has no "
                       "server of ours to restart");
    return;
  }
  keeper_restart_server (d->k);
  mloop_control_add (out, "ok", "1");
}

static void
list (struct mloop_control_out *out)
{
  g_autoptr (GString) dirs = g_string_new (NULL);
  GHashTableIter i;
  gpointer dir;

  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, &dir, NULL))
    g_string_append_printf (dirs, "%s%s", dirs->len ? "\n" : "",
                            (const char *) dir);
  if (!mloop_control_add (out, "dirs", dirs->str)) {
    mloop_control_out_init (out);
    mloop_control_add (out, "error", "too many devices to list in one "
                       "answer");
    return;
  }
  mloop_control_add (out, "ok", "1");
}

/* Answers IN in OUT, or (false) later: see keep. */
static bool
answer (const struct mloop_control_in *in, struct mloop_control_out *out,
        int sock)
{
  const char *op = mloop_control_get (in, "op");

  if (op && strcmp (op, "keep") == 0)
    return keep (in, out, sock);
  else if (op && strcmp (op, "drop") == 0)
    drop (in, out);
  else if (op && strcmp (op, "restart") == 0)
    restart (in, out);
  else if (op && strcmp (op, "has") == 0) {
    if (find_kept (in, out))
      mloop_control_add (out, "ok", "1");
  }
  else if (op && strcmp (op, "list") == 0)
    list (out);
  else
    mloop_control_add (out, "error", "unknown op (keep, drop, restart, has "
                       "or list)");
  return true;
}

/* One client's requests, each answered in turn: its next request is
 * read only once the answer is sent.  Its socket does not block
 * (on_connect): a client whose answer would not fit, one that does not
 * read them, is dropped rather than block every other client and device.
 */
static gboolean
on_request (gint sock, GIOCondition c, gpointer unused)
{
  struct mloop_control_in *in;
  struct mloop_control_out *out;
  char err[512];
  int r;
  bool answered = true;

  in = g_new (struct mloop_control_in, 1);
  errno = 0;
  r = mloop_control_recv (sock, in, err, sizeof err);
  if (r == -1 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
    /* Woken with nothing to read after all. */
    g_free (in);
    return G_SOURCE_CONTINUE;
  }
  out = g_new (struct mloop_control_out, 1);
  mloop_control_out_init (out);
  if (r == 1 && stopping) {
    /* Its keepers let go (or about to be): nothing is asked of them. */
    mloop_control_add (out, "error", "mloopd is stopping");
    mloop_control_in_clear (in);
  }
  else if (r == 1) {
    answered = answer (in, out, sock);
    /* Closes what descriptors came along: none is wanted yet. */
    mloop_control_in_clear (in);
  }
  else if (r == -1)
    mloop_control_add (out, "error", err);
  if (answered && r != 0 && mloop_control_send (sock, out, NULL, 0) == -1)
    r = 0;
  g_free (in);
  g_free (out);
  if (r == 0) {
    close (sock);
    return G_SOURCE_REMOVE;
  }
  /* A waiting answer: the client's next request is read after it. */
  return answered ? G_SOURCE_CONTINUE : G_SOURCE_REMOVE;
}

static int listener = -1;
/* The listener's watch, or its rest's timeout (on_connect), or 0. */
static guint listening;
/* Out of descriptors since it was said; said again once over. */
static bool said_full;

static gboolean on_connect (gint fd, GIOCondition c, gpointer unused);

static gboolean
listen_again (gpointer unused)
{
  listening = g_unix_fd_add (listener, G_IO_IN, on_connect, NULL);
  return G_SOURCE_REMOVE;
}

/* A connection that cannot be accepted for want of a descriptor (or of
 * memory) stays queued, and the listener readable: watched on, it would
 * wake the loop at once, again and again, at full CPU for as long.  So
 * the listener rests ACCEPT_RETRY_MS instead, the devices' sources
 * running meanwhile (a client that goes frees its descriptor); it is
 * said once, and once more when it is over.
 */
static gboolean
rest_listener (int e)
{
  if (!said_full)
    say ("out of descriptors or memory to accept a client (%s): trying "
         "again every %d ms", strerror (e), ACCEPT_RETRY_MS);
  said_full = true;
  listening = g_timeout_add (ACCEPT_RETRY_MS, listen_again, NULL);
  return G_SOURCE_REMOVE;
}

static gboolean
on_connect (gint fd, GIOCondition c, gpointer unused)
{
  struct ucred cred;
  int sock = accept4 (fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

  if (sock == -1 && (errno == EMFILE || errno == ENFILE ||
                     errno == ENOBUFS || errno == ENOMEM))
    return rest_listener (errno);
  if (sock == -1)
    return G_SOURCE_CONTINUE;   /* gone before it was accepted, EAGAIN */
  if (said_full)
    say ("accepting clients again");
  said_full = false;
  /* Root only: a request runs a server as root on the image it names. */
  if (mloop_control_peer (sock, &cred) == -1 || cred.uid != 0) {
    struct mloop_control_out out;

    mloop_control_out_init (&out);
    mloop_control_add (&out, "error", "mloopd answers root only");
    mloop_control_send (sock, &out, NULL, 0);
    close (sock);
    return G_SOURCE_CONTINUE;
  }
  g_unix_fd_add (sock, G_IO_IN | G_IO_HUP | G_IO_ERR, on_request, NULL);
  return G_SOURCE_CONTINUE;
}

/* Holds RUNTIME_DIR/mloopd.lock for the process's life (the descriptor
 * is never closed; the kernel lets go when the process ends), with our
 * pid in it: a second mloopd on the same runtime directory would take
 * over the devices the first still keeps, and bind its socket path.
 * 0, or -1 with ERR naming the holder.
 */
static int
lock_runtime_dir (char *err, size_t errlen)
{
  g_autofree char *path = g_build_filename (mloop_runtime_dir (),
                                            MLOOP_SERVICE_LOCK, NULL);
  char pid[32];
  int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  ssize_t n;

  if (fd == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return -1;
  }
  if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
    int e = errno;

    n = e == EWOULDBLOCK ? pread (fd, pid, sizeof pid - 1, 0) : -1;
    close (fd);
    if (e != EWOULDBLOCK)
      snprintf (err, errlen, "%s: %s", path, strerror (e));
    else if (n > 0 && (pid[n] = '\0', atoi (pid) > 0))
      snprintf (err, errlen, "mloopd pid %d keeps %s already", atoi (pid),
                mloop_runtime_dir ());
    else
      snprintf (err, errlen, "another mloopd keeps %s already",
                mloop_runtime_dir ());
    return -1;
  }
  n = snprintf (pid, sizeof pid, "%d\n", (int) getpid ());
  if (ftruncate (fd, 0) == -1 || pwrite (fd, pid, (size_t) n, 0) != n)
    say ("%s: cannot write our pid: %s", path, strerror (errno));
  return 0;
}

/* The socket path bound here and its file, removed at exit if it is
 * still ours (the next mloopd may have bound its own there already);
 * NULL for systemd's.
 */
static const char *bound;
static struct stat bound_st;

/* The listening socket: systemd's, or PATH bound here.  -1 with ERR. */
static int
listen_on (const char *path, char *err, size_t errlen)
{
  const char *pid = g_getenv ("LISTEN_PID"), *fds = g_getenv ("LISTEN_FDS");
  struct sockaddr_un a = { .sun_family = AF_UNIX };
  int sock;

  if (pid && fds && atoi (pid) == (int) getpid () && atoi (fds) == 1) {
    g_unsetenv ("LISTEN_PID");
    g_unsetenv ("LISTEN_FDS");
    fcntl (SD_LISTEN_FDS_START, F_SETFD, FD_CLOEXEC);
    return SD_LISTEN_FDS_START;
  }
  if (strlen (path) >= sizeof a.sun_path) {
    snprintf (err, errlen, "%s: the path is too long for a socket", path);
    return -1;
  }
  strcpy (a.sun_path, path);
  sock = socket (AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  /* A socket left by an mloopd that died; none answers on it. */
  g_unlink (path);
  if (sock == -1 || bind (sock, (struct sockaddr *) &a, sizeof a) == -1 ||
      chmod (path, 0600) == -1 || listen (sock, 64) == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    if (sock != -1)
      close (sock);
    return -1;
  }
  bound = path;
  stat (path, &bound_st);
  return sock;
}

/* A recorded device's new server listens, or did not start: then it is
 * said, and its record left for a look.
 */
static void
on_taken_over (struct keeper *k, const char *start_err, void *data)
{
  struct kept *d = data;

  if (start_err == NULL)
    return;
  say ("%s: cannot keep it: %s", d->dir, start_err);
  keeper_let_go (d->k);
  g_hash_table_remove (kept, d->dir);
}

/* Takes over every device a service before us kept: its server if it
 * still serves, else a new one (started as a keep's is, all at once).
 * Those that cannot be are said, and their records left for a look.
 */
static void
take_over_recorded (void)
{
  g_autoptr (GDir) runtime = g_dir_open (mloop_runtime_dir (), 0, NULL);
  const char *name;

  while (runtime && (name = g_dir_read_name (runtime)) != NULL) {
    g_autofree char *dir = g_build_filename (mloop_runtime_dir (), name,
                                             NULL);
    g_autofree char *pid_path = g_build_filename (dir, MLOOP_DIR_SERVER_PID,
                                                  NULL);
    g_autofree char *pid_text = NULL;
    g_autofree char *remote = NULL;
    struct mloop_server_spec spec;
    struct kept *d;
    char err[1024];

    /* Devices' directories only (not the state lock, not our lock or
     * socket).
     */
    if (!g_file_test (dir, G_FILE_TEST_IS_DIR))
      continue;
    if (keep_record_load (dir, &spec, &remote, err, sizeof err) == -1) {
      if (errno != ENOENT)
        say ("%s", err);
      continue;
    }
    if (remote) {
      d = kept_new_remote (dir, remote, err, sizeof err);
      if (d == NULL)
        say ("%s: cannot keep it: %s", dir, err);
      else {
        g_hash_table_insert (kept, d->dir, d);
        if (drop_if_attach_died (d))
          g_hash_table_remove (kept, dir);
      }
      continue;
    }
    d = kept_new (dir, &spec, err, sizeof err);
    if (d == NULL) {
      say ("%s: %s", dir, err);
    }
    else {
      pid_t server = g_file_get_contents (pid_path, &pid_text, NULL, NULL)
        ? (pid_t) atoi (pid_text) : 0;
      bool serving;

      g_hash_table_insert (kept, d->dir, d);
      /* Its running server taken over first, what a start left beside
       * it killed: a device whose attach died goes with them.
       */
      serving = keeper_take_over (d->k, server, err, sizeof err) == 0;
      if (drop_if_attach_died (d))
        g_hash_table_remove (kept, dir);
      else if (!serving)
        keeper_take_over_new (d->k, on_taken_over, d);
    }
    g_free ((char *) spec.image);
    g_free ((char *) spec.overlay);
  }
}

/* Whether PID is the server a keeper watches, or one a start waits
 * for: its exit is theirs to reap (they read the status).
 */
static bool
kept_server (pid_t pid)
{
  GHashTableIter i;
  gpointer d;

  if (server_start_awaits (pid))
    return true;
  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, NULL, &d))
    if (((struct kept *) d)->k &&
        keeper_server_pid (((struct kept *) d)->k) == pid)
      return true;
  return false;
}

/* Reaps the children that ended and that no keeper waits for: a
 * daemonizing nbdkit's intermediate process, reparented to us as the
 * child subreaper, which mloop-supervisor leaves one of for its life
 * but which here would pile up, one per server started.  Its children
 * are listed by the kernel (/proc/self/task/TID/children: mloopd
 * forks from its main thread only).
 */
static gboolean
reap_strays (gpointer unused)
{
  g_autofree char *path = g_strdup_printf ("/proc/self/task/%d/children",
                                           (int) getpid ());
  g_autofree char *text = NULL;
  g_auto (GStrv) pids = NULL;

  if (!g_file_get_contents (path, &text, NULL, NULL))
    return G_SOURCE_CONTINUE;
  pids = g_strsplit (g_strstrip (text), " ", -1);
  for (char **p = pids; *p; p++) {
    pid_t pid = (pid_t) atoi (*p);
    siginfo_t info = { 0 };

    if (pid <= 0 || kept_server (pid))
      continue;
    /* Only one that has ended (WNOWAIT: looked at, left as it is). */
    if (waitid (P_PID, (id_t) pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == pid)
      waitpid (pid, NULL, WNOHANG);
  }
  return G_SOURCE_CONTINUE;
}

static unsigned
keeps_waiting (void)
{
  GHashTableIter i;
  gpointer d;
  unsigned n = 0;

  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, NULL, &d))
    n += ((struct kept *) d)->waiting != -1;
  return n;
}

/* Wakes the loop at the deadline: it may have nothing else to wake it. */
static gboolean
wake (gpointer unused)
{
  return G_SOURCE_REMOVE;
}

/* Runs the main loop on while COUNT is not 0 (servers starting), until
 * DEADLINE (monotonic, in microseconds).
 */
static void
finish_starts (unsigned (*count) (void), gint64 deadline)
{
  gint64 left;

  while (count () > 0 && (left = deadline - g_get_monotonic_time ()) > 0) {
    guint timer = g_timeout_add ((guint) ((left + 999) / 1000), wake, NULL);

    g_main_context_iteration (NULL, TRUE);
    g_source_remove (timer);
  }
}

/* At the stop's deadline: a keep whose server does not listen yet is
 * answered as a failed start (the client's attach fails), its record
 * removed, and its server killed with the rest (server_starts_kill).
 */
static void
fail_waiting_keeps (void)
{
  GHashTableIter i;
  gpointer d;

  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, NULL, &d)) {
    struct kept *w = d;
    struct mloop_control_out out;
    int sock = w->waiting;

    if (sock == -1)
      continue;
    say ("%s: mloopd is stopping and its server did not listen in time",
         w->dir);
    keep_record_remove (w->dir);
    kept_stop (w);
    g_hash_table_iter_remove (&i);
    mloop_control_out_init (&out);
    mloop_control_add (&out, "error", "mloopd is stopping, and the server "
                       "did not listen in time");
    answer_waiting (sock, &out);
  }
}

/* A device costs mloopd two descriptors (its server's pidfd and its
 * log) when a server process serves it, and about 32 when mloopd serves
 * it itself (per connection its socket and splice pipe, per worker its
 * epoll set and eventfds, the image, the listener), so a thousand
 * devices need more than the usual soft limit of 1024.  The hard limit
 * is what the system grants (systemd's default: 524288); mloopd polls
 * and never uses select(2), so the soft one is raised to it.  Its
 * servers inherit it, and poll too.
 */
static void
raise_descriptor_limit (void)
{
  struct rlimit r;

  if (getrlimit (RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (setrlimit (RLIMIT_NOFILE, &r) == -1)
      say ("cannot raise the descriptor limit to %llu: %s",
           (unsigned long long) r.rlim_max, strerror (errno));
  }
}

static gboolean
on_stop_signal (gpointer unused)
{
  g_main_loop_quit (loop);
  return G_SOURCE_REMOVE;
}

int
main (int argc, char **argv)
{
  g_autofree char *control = NULL;
  g_autofree char *serve = NULL;
  gint stop_wait = STOP_WAIT_S;
  GOptionEntry entries[] = {
    { "control", 'c', 0, G_OPTION_ARG_FILENAME, &control,
      "The control socket (default: RUNTIME_DIR/" MLOOP_SERVICE_SOCKET ")",
      "PATH" },
    { "stop-wait", 0, 0, G_OPTION_ARG_INT, &stop_wait,
      "How long a stop waits for servers starting (default: "
      G_STRINGIFY (STOP_WAIT_S) "; within systemd's TimeoutStopSec)", "S" },
    { "serve", 0, 0, G_OPTION_ARG_STRING, &serve,
      "Where a native server runs: process (a mloop-server each; the "
      "default) or in-process (inside mloopd)", "WHERE" },
    G_OPTION_ENTRY_NULL
  };
  g_autoptr (GOptionContext) ctx = g_option_context_new (NULL);
  g_autoptr (GError) gerr = NULL;
  GHashTableIter i;
  gpointer d;
  struct stat st;
  char err[512];
  gint64 deadline;

  g_option_context_add_main_entries (ctx, entries, NULL);
  if (!g_option_context_parse (ctx, &argc, &argv, &gerr) || argc != 1 ||
      stop_wait < 0) {
    fprintf (stderr, "mloopd: %s\n", gerr ? gerr->message : argc != 1
             ? "no arguments but options" : "--stop-wait: not negative");
    return EXIT_FAILURE;
  }
  if (serve && strcmp (serve, "in-process") && strcmp (serve, "process")) {
    fprintf (stderr, "mloopd: --serve=%s: must be process or in-process\n",
             serve);
    return EXIT_FAILURE;
  }
  serve_in_process = serve && strcmp (serve, "in-process") == 0;
  if (mloop_runtime_dir_create (err, sizeof err) == -1) {
    fprintf (stderr, "mloopd: %s\n", err);
    return EXIT_FAILURE;
  }
  /* Before the socket: binding unlinks whatever is at its path. */
  if (lock_runtime_dir (err, sizeof err) == -1) {
    fprintf (stderr, "mloopd: %s\n", err);
    return EXIT_FAILURE;
  }
  if (control == NULL)
    control = g_build_filename (mloop_runtime_dir (), MLOOP_SERVICE_SOCKET,
                                NULL);
  listener = listen_on (control, err, sizeof err);
  if (listener == -1) {
    fprintf (stderr, "mloopd: %s\n", err);
    return EXIT_FAILURE;
  }
  raise_descriptor_limit ();
  /* A server a keeper started and then a nbdkit's daemon: ours to reap. */
  prctl (PR_SET_CHILD_SUBREAPER, 1);
  signal (SIGPIPE, SIG_IGN);
  kept = g_hash_table_new_full (g_str_hash, g_str_equal, NULL, kept_free);
  loop = g_main_loop_new (NULL, FALSE);
  g_unix_signal_add (SIGTERM, on_stop_signal, NULL);
  g_unix_signal_add (SIGINT, on_stop_signal, NULL);
  /* Looked for every STRAY_REAP_S: glib watches no SIGCHLD of its own,
   * and one blocked for a signalfd would be blocked in every server.
   */
  g_timeout_add_seconds (STRAY_REAP_S, reap_strays, NULL);
  g_timeout_add_seconds (ATTACH_CHECK_S, check_attaches, NULL);
  keeper_hold_shared ();
  take_over_recorded ();
  listening = g_unix_fd_add (listener, G_IO_IN, on_connect, NULL);
  say ("mloopd pid %d keeps %u device(s), listening on %s", (int) getpid (),
       g_hash_table_size (kept), control);
  g_main_loop_run (loop);

  /* Stopped (an upgrade, a restart): the devices serve on, for the next
   * one to take over from their records.
   */
  say ("mloopd pid %d stopping; %u device(s) serve on", (int) getpid (),
       g_hash_table_size (kept));
  g_source_remove (listening);      /* its watch, or its rest */
  stopping = true;
  /* One deadline for the whole stop, within systemd's (STOP_WAIT_S). */
  deadline = g_get_monotonic_time () + stop_wait * G_USEC_PER_SEC;
  /* The keeps under way are answered first: their clients go on. */
  finish_starts (keeps_waiting, deadline);
  fail_waiting_keeps ();
  /* Out of the table as each is let go: what the loop runs from now on
   * (a client's request, the reaper, an autoclear's idle) finds none.
   */
  g_hash_table_iter_init (&i, kept);
  while (g_hash_table_iter_next (&i, NULL, &d)) {
    kept_let_go (d);
    g_hash_table_iter_remove (&i);
  }
  /* Restarts under way were let go: their servers serve on, and the next
   * mloopd must find their pid files written; those still queued were
   * dropped (server_start_abandon).  Those that do not listen by the
   * deadline are killed: the next mloopd finds their records and no
   * server, and starts one.  A start whose server is past killing
   * (nbdkit's daemon, forked, its pid file not yet written) is left
   * behind with its record.
   */
  finish_starts (server_starts_pending, deadline);
  if (server_starts_pending () > 0) {
    say ("killing %u server(s) that did not listen within %d s",
         server_starts_pending (), stop_wait);
    server_starts_kill ();
    finish_starts (server_starts_pending, g_get_monotonic_time () +
                   STOP_KILL_WAIT_S * G_USEC_PER_SEC);
  }
  g_hash_table_destroy (kept);
  close (listener);
  if (bound && stat (bound, &st) == 0 && st.st_dev == bound_st.st_dev &&
      st.st_ino == bound_st.st_ino)
    g_unlink (bound);
  return EXIT_SUCCESS;
}
