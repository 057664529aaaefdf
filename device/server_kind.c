/* mloop — the servers mloop runs, one row of a table each. */
#include <inttypes.h>
#include <string.h>

#include <glib.h>

#include "errmsg.h"
#include "server_kind.h"
#include "server_process.h"
#include "engine.h"
#include "store_name.h"

static void
add (GPtrArray *argv, char *arg)
{
  g_ptr_array_add (argv, arg);
}

/* --tls, --tls-psk, --tls-certificates, --tls-verify-peer: spelt the
 * same for both.
 */
static void
add_tls (const struct mloop_server_config *c, GPtrArray *argv)
{
  if (c->tls != MLOOP_TLS_OFF)
    add (argv, g_strdup_printf ("--tls=%s", c->tls == MLOOP_TLS_REQUIRE
                                ? "require" : "on"));
  if (c->tls_psk)
    add (argv, g_strdup_printf ("--tls-psk=%s", c->tls_psk));
  if (c->tls_certificates)
    add (argv, g_strdup_printf ("--tls-certificates=%s",
                                c->tls_certificates));
  if (c->tls_verify_peer)
    add (argv, g_strdup ("--tls-verify-peer"));
}

/* mloop-server --listen=unix:PATH|tcp:HOST:PORT [OPTIONS] -- IMAGE */
static void
native_command (const struct mloop_server_config *c, GPtrArray *argv)
{
  const struct mloop_nbd_address *l = c->listen;

  add (argv, mloop_locate_program ("MLOOP_SERVER_BIN", "server/mloop-server",
                                   MLOOP_SBINDIR "/mloop-server"));
  if (l->unix_path)
    add (argv, g_strdup_printf ("--listen=unix:%s", l->unix_path));
  else if (strchr (l->host, ':'))
    add (argv, g_strdup_printf ("--listen=tcp:[%s]:%s", l->host, l->port));
  else
    add (argv, g_strdup_printf ("--listen=tcp:%s:%s", l->host, l->port));
  if (c->pid_file)
    add (argv, g_strdup_printf ("--pid-file=%s", c->pid_file));
  if (c->threads)
    add (argv, g_strdup_printf ("--threads=%u", c->threads));
  if (c->read_only)
    add (argv, g_strdup ("--read-only"));
  if (c->export_name)
    add (argv, g_strdup_printf ("--export-name=%s", c->export_name));
  if (c->stats_file)
    add (argv, g_strdup_printf ("--stats-file=%s", c->stats_file));
  if (c->max_connections)
    add (argv, g_strdup_printf ("--max-connections=%u", c->max_connections));
  if (c->max_per_client)
    add (argv, g_strdup_printf ("--max-connections-per-client=%u",
                                c->max_per_client));
  if (c->keepalive)
    add (argv, g_strdup_printf ("--keepalive=%s", c->keepalive));
  if (c->offset)
    add (argv, g_strdup_printf ("--offset=%" PRIu64, c->offset));
  if (c->sizelimit)
    add (argv, g_strdup_printf ("--sizelimit=%" PRIu64, c->sizelimit));
  if (c->overlay)
    add (argv, g_strdup_printf ("--overlay=%s", c->overlay));
  if (c->overlay && c->overlay_must_exist)
    add (argv, g_strdup ("--overlay-must-exist"));
  if (c->kernel_client)
    add (argv, g_strdup ("--splice=on"));
  if (c->lock_record)
    add (argv, g_strdup_printf ("--lock-record=%s", c->lock_record));
  if (c->io_timeout)
    add (argv, g_strdup_printf ("--io-timeout=%u", c->io_timeout));
  add_tls (c, argv);
  add (argv, g_strdup ("--"));
  add (argv, g_strdup (c->image));
}

/* nbdkit [OPTIONS] PLUGIN file=IMAGE [PARAMETERS] */
static void
nbdkit_command (const struct mloop_server_config *c, GPtrArray *argv)
{
  const struct mloop_nbd_address *l = c->listen;

  add (argv, g_strdup ("nbdkit"));
  /* A device's nbdkit runs without -f: Debian's nbdkit 1.32.5 calls
   * set_exit_with_parent() unconditionally, so in the foreground it
   * would die with `mloop attach`.  Daemonizing forks, which clears the
   * parent-death signal; its pid then comes from the pid file, and after
   * the fork its messages go to syslog (startup errors still reach
   * server.log).
   */
  if (c->foreground)
    add (argv, g_strdup ("-f"));
  /* Debug messages, for diagnosing a device from server.log. */
  if (g_getenv ("MLOOP_SERVER_VERBOSE"))
    add (argv, g_strdup ("-v"));
  if (l->unix_path)
    add (argv, g_strdup_printf ("--unix=%s", l->unix_path));
  else {
    if (*l->host)
      add (argv, g_strdup_printf ("--ipaddr=%s", l->host));
    add (argv, g_strdup_printf ("--port=%s", l->port));
  }
  if (c->pid_file)
    add (argv, g_strdup_printf ("--pidfile=%s", c->pid_file));
  if (c->read_only)
    add (argv, g_strdup ("--readonly"));
  if (c->export_name)
    add (argv, g_strdup_printf ("--exportname=%s", c->export_name));
  add_tls (c, argv);
  /* nbdkit's limit filter closes connections past its limit, as
   * mloop-server's --max-connections does; it has no per-client cap.
   */
  if (c->max_connections)
    add (argv, g_strdup ("--filter=limit"));
  add (argv, mloop_locate_program ("MLOOP_PLUGIN",
                                   "plugin/nbdkit-mloop-plugin.so", "mloop"));
  if (mloop_is_rbd_name (c->image))
    add (argv, g_strdup_printf ("rbd=%s",
                                c->image + strlen (MLOOP_RBD_PREFIX)));
  else
    add (argv, g_strdup_printf ("file=%s", c->image));
  /* Besides --readonly, which the plugin learns only per connection,
   * after it opened the image (an RBD image's lock taken).
   */
  if (c->read_only)
    add (argv, g_strdup ("readonly=on"));
  if (c->max_connections)
    add (argv, g_strdup_printf ("limit=%u", c->max_connections));
  if (c->threads)
    add (argv, g_strdup_printf ("threads=%u", c->threads));
  if (c->stats_file)
    add (argv, g_strdup_printf ("stats=%s", c->stats_file));
  if (c->offset)
    add (argv, g_strdup_printf ("offset=%" PRIu64, c->offset));
  if (c->sizelimit)
    add (argv, g_strdup_printf ("sizelimit=%" PRIu64, c->sizelimit));
  if (c->overlay)
    add (argv, g_strdup_printf ("overlay=%s", c->overlay));
  if (c->overlay && c->overlay_must_exist)
    add (argv, g_strdup ("overlay-must-exist=on"));
  if (c->lock_record)
    add (argv, g_strdup_printf ("lock-record=%s", c->lock_record));
  if (c->io_timeout)
    add (argv, g_strdup_printf ("io-timeout=%u", c->io_timeout));
}

/* mloop-server reads up to its CONN_SLOTS (server/conn.h) requests of a
 * connection and submits them all; nbdkit works on as many as its
 * --threads (16 by default), one per thread, and leaves the rest unread.
 */
#define NATIVE_REQUESTS_AT_ONCE 128
#define NBDKIT_REQUESTS_AT_ONCE 16

/* The default first. */
static const struct mloop_server_kind kinds[] = {
  { .name = "native", .command = native_command, .tls = true,
    .requests_at_once = NATIVE_REQUESTS_AT_ONCE, .resizes_on_sighup = true,
    .per_client_cap = true, .keepalive_settings = true },
  { .name = "nbdkit", .command = nbdkit_command, .tls = true,
    .daemonizes = true, .requests_at_once = NBDKIT_REQUESTS_AT_ONCE },
};

const struct mloop_server_kind *
mloop_server_kind_default (void)
{
  return &kinds[0];
}

const struct mloop_server_kind *
mloop_server_kind_tls (void)
{
  for (size_t i = 0; i < G_N_ELEMENTS (kinds); i++)
    if (kinds[i].tls)
      return &kinds[i];
  return NULL;
}

const struct mloop_server_kind *
mloop_server_kind_find (const char *name, char *err, size_t errlen)
{
  g_autoptr (GString) names = g_string_new (NULL);

  for (size_t i = 0; i < G_N_ELEMENTS (kinds); i++) {
    if (strcmp (name, kinds[i].name) == 0)
      return &kinds[i];
    g_string_append_printf (names, "%s%s", i == 0 ? ""
                            : i + 1 < G_N_ELEMENTS (kinds) ? ", " : " or ",
                            kinds[i].name);
  }
  mloop_fail (err, errlen, "%s: must be %s", name, names->str);
  return NULL;
}

char **
mloop_server_command (const struct mloop_server_kind *kind,
                      const struct mloop_server_config *c)
{
  GPtrArray *argv = g_ptr_array_new ();

  kind->command (c, argv);
  g_ptr_array_add (argv, NULL);
  return (char **) g_ptr_array_free (argv, FALSE);
}
