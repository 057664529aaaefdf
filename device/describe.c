/* mloop — how devices are described, as a table or JSON (json-glib's):
 * what `mloop list` and `mloop status` print, and what mloop's D-Bus
 * service answers a user's list with.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <stdio.h>
#include <pwd.h>

#include <glib.h>
#include <json-glib/json-glib.h>

#include "describe.h"
#include "printable.h"
#include "user_db.h"

static void
member_string (JsonBuilder *b, const char *name, const char *value)
{
  json_builder_set_member_name (b, name);
  if (value)
    json_builder_add_string_value (b, value);
  else
    json_builder_add_null_value (b);
}

/* A name a user may have chosen (printable.h): JSON escapes the C0
 * controls itself and json_print the rest; a name that is not UTF-8,
 * which a JSON string cannot hold, is given in its escaped form.
 */
static void
member_name (JsonBuilder *b, const char *name, const char *value)
{
  g_autofree char *shown = value && !g_utf8_validate (value, -1, NULL)
    ? mloop_printable (value) : NULL;

  member_string (b, name, shown ? shown : value);
}

static void
member_int (JsonBuilder *b, const char *name, gint64 value)
{
  json_builder_set_member_name (b, name);
  json_builder_add_int_value (b, value);
}

static void
member_bool (JsonBuilder *b, const char *name, bool value)
{
  json_builder_set_member_name (b, name);
  json_builder_add_boolean_value (b, value);
}

/* The name of the user who attached S (their uid when it has none);
 * g_free it.
 */
static char *
owner_name (const struct mloop_device_state *s)
{
  struct passwd pw;
  g_autofree char *buf = NULL;

  if (mloop_user_by_uid (s->owner, &pw, &buf) == 0)
    return g_strdup (pw.pw_name);
  return g_strdup_printf ("%u", (unsigned) s->owner);
}

/* A device as `mloop list --json` lists it: one object. */
static void
json_device (JsonBuilder *b, const struct mloop_device_state *s)
{
  g_autofree char *dev = mloop_state_device_path (s);
  g_autofree char *sock = s->transport == MLOOP_TRANSPORT_UBLK ? NULL
    : mloop_state_path (s, MLOOP_DIR_SOCKET);
  g_autofree char *log = s->remote ? NULL
    : mloop_state_path (s, MLOOP_DIR_SERVER_LOG);
  g_autofree char *owner = owner_name (s);

  json_builder_begin_object (b);
  member_string (b, "device", dev);
  member_string (b, "transport", mloop_state_transport_name (s));
  member_name (b, "file", mloop_state_image_name (s));
  if (s->transport == MLOOP_TRANSPORT_NBD)
    member_name (b, "backend", mloop_state_backend (s));
  member_string (b, "owner", owner);
  member_int (b, "owner_uid", s->owner);
  member_int (b, "size", (gint64) s->size);
  member_int (b, "offset", (gint64) s->offset);
  member_int (b, "sizelimit", (gint64) s->sizelimit);
  if (s->overlay) {
    member_name (b, "overlay", s->overlay);
    member_bool (b, "overlay_temporary", s->overlay_temporary);
  }
  member_int (b, "block_size", s->block_size);
  member_bool (b, "read_only", s->read_only);
  member_bool (b, "autoclear", s->autoclear);
  member_bool (b, "partscan", s->partscan);
  member_int (b, "connections", s->connections);
  member_int (b, "threads", s->threads);
  member_string (b, "server", mloop_state_server_name (s));
  member_int (b, "server_pid", s->server_pid);
  member_bool (b, "server_in_process", s->server_in_process);
  member_string (b, "socket", sock);
  member_string (b, "server_log", log);
  member_int (b, "timeout", s->timeout);
  member_int (b, "dead_timeout", s->dead_timeout);
  json_builder_end_object (b);
}

/* Prints what B built, on one line.  json-glib writes DEL, the C1
 * controls (U+0080 to U+009F, which terminals read as escapes) and the
 * invisible format characters (printable.h) as they are; they can only
 * be inside strings, where \uXXXX means the same.
 */
static void
json_print (FILE *f, JsonBuilder *b)
{
  g_autoptr (JsonGenerator) gen = json_generator_new ();
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_autofree char *text = NULL;

  json_generator_set_root (gen, root);
  text = json_generator_to_data (gen, NULL);
  for (const char *p = text; *p; p++) {
    unsigned char c = (unsigned char) *p;

    if (c == 0x7f)
      fputs ("\\u007f", f);
    else if (c == 0xc2 && (unsigned char) p[1] >= 0x80 &&
             (unsigned char) p[1] <= 0x9f)
      fprintf (f, "\\u00%02x", (unsigned char) *++p);
    else if (c >= 0xc2 &&
             mloop_is_invisible_format (g_utf8_get_char_validated (p, -1))) {
      gunichar u = g_utf8_get_char (p);

      /* Past U+FFFF (tag characters), JSON's \u is a surrogate pair. */
      if (u > 0xffff)
        fprintf (f, "\\u%04x\\u%04x", 0xd800 + ((u - 0x10000) >> 10),
                 0xdc00 + ((u - 0x10000) & 0x3ff));
      else
        fprintf (f, "\\u%04x", (unsigned) u);
      p = g_utf8_next_char (p) - 1;
    } else
      fputc (c, f);
  }
  fputc ('\n', f);
}

void
mloop_describe_list (FILE *f, const struct mloop_device_state *list, size_t n,
                     bool json)
{
  if (json) {
    g_autoptr (JsonBuilder) b = json_builder_new ();

    json_builder_begin_array (b);
    for (size_t i = 0; i < n; i++)
      json_device (b, &list[i]);
    json_builder_end_array (b);
    json_print (f, b);
    return;
  }
  if (n == 0)
    return;                     /* like losetup --list: silence */
  fprintf (f, "%-12s %14s %14s %14s %2s %5s %7s %-6s %7s %-8s %s\n",
           "DEVICE", "SIZE", "OFFSET", "SIZELIMIT", "RO", "CONNS", "THREADS",
           "SERVER", "PID", "OWNER", "BACK-FILE");
  for (size_t i = 0; i < n; i++) {
    const struct mloop_device_state *s = &list[i];
    g_autofree char *dev = mloop_state_device_path (s);
    g_autofree char *owner = owner_name (s);
    g_autofree char *file = mloop_printable (mloop_state_image_name (s));
    g_autofree char *overlay = mloop_printable (s->overlay);

    fprintf (f, "%-12s %14" PRIu64 " %14" PRIu64 " %14" PRIu64
             " %2d %5u %7u %-6s %7d %-8s %s%s%s%s\n", dev, s->size,
             s->offset, s->sizelimit, s->read_only, s->connections,
             s->threads, mloop_state_server_name (s), (int) s->server_pid,
             owner, file, overlay ? " (overlay " : "",
             overlay ? overlay : "", overlay ? ")" : "");
  }
}

static void
print_counters (FILE *f, const struct mloop_device_status *st)
{
  const struct mloop_stats *c = &st->stats;

  if (!st->have_stats) {
    fprintf (f, "  counters: not available (no stats file)\n");
    return;
  }
  fprintf (f, "  connections open: %" PRIu64 " (%" PRIu64 " since start)\n",
           c->connections, c->connections_total);
  fputs ("  requests:", f);
  for (int i = 0; i < MLOOP_STATS_NR_COMMANDS; i++)
    fprintf (f, " %s %" PRIu64, mloop_stats_command_name (i), c->requests[i]);
  fprintf (f, "\n  bytes:   read %" PRIu64 ", written %" PRIu64 "\n",
           c->bytes_read, c->bytes_written);
  fprintf (f, "  errors:  %" PRIu64 "\n  in flight: %" PRIu64 "\n",
           c->errors, c->in_flight);
}

void
mloop_describe_status (FILE *f, const struct mloop_device_state *s,
                       const struct mloop_device_status *st, bool json)
{
  const struct mloop_stats *c = &st->stats;

  if (json) {
    g_autoptr (JsonBuilder) b = json_builder_new ();

    json_builder_begin_object (b);
    json_builder_set_member_name (b, "device");
    json_device (b, s);
    member_bool (b, "server_running", st->server_running);
    member_bool (b, "kernel_connected", st->kernel_connected);
    member_int (b, "hardware_queues", st->hardware_queues);
    member_int (b, "supervisor_pid", s->supervisor_pid);
    member_bool (b, "supervisor_running", st->supervisor_running);
    member_bool (b, "service_kept", s->service_kept);
    member_int (b, "restarts", s->restarts);
    member_string (b, "last_failure", s->last_failure);
    member_int (b, "reconnects", s->reconnects);
    member_string (b, "last_reconnect", s->last_reconnect);
    if (st->have_stats) {
      member_int (b, "connections_open", (gint64) c->connections);
      member_int (b, "connections_total", (gint64) c->connections_total);
      json_builder_set_member_name (b, "requests");
      json_builder_begin_object (b);
      for (int i = 0; i < MLOOP_STATS_NR_COMMANDS; i++)
        member_int (b, mloop_stats_command_name (i),
                    (gint64) c->requests[i]);
      json_builder_end_object (b);
      member_int (b, "bytes_read", (gint64) c->bytes_read);
      member_int (b, "bytes_written", (gint64) c->bytes_written);
      member_int (b, "errors", (gint64) c->errors);
      member_int (b, "in_flight", (gint64) c->in_flight);
    }
    json_builder_end_object (b);
    json_print (f, b);
    return;
  }
  g_autofree char *dev = mloop_state_device_path (s);
  g_autofree char *file = mloop_printable (mloop_state_image_name (s));
  g_autofree char *overlay = mloop_printable (s->overlay);

  fprintf (f, "%s: %s\n", dev, file);
  if (s->offset || s->sizelimit)
    fprintf (f, "  window:  offset %" PRIu64 ", sizelimit %" PRIu64
             ", %" PRIu64 " bytes\n", s->offset, s->sizelimit, s->size);
  if (s->overlay)
    fprintf (f, "  overlay: %s%s (the image is only read)\n", overlay,
             s->overlay_temporary ? ", deleted at detach" : "");
  if (s->transport == MLOOP_TRANSPORT_UBLK) {
    /* No socket, no connection: mloop-ublk is the server, and its
     * queues count as the connections do.
     */
    fprintf (f, "  kernel:  ublk, %s, %u hardware queues\n",
             st->kernel_connected ? "present" : "NOT present",
             st->hardware_queues);
    fprintf (f, "  server:  mloop-ublk, pid %d, %s\n", (int) s->server_pid,
             st->server_running ? "running" : "NOT running");
    fprintf (f, "  supervisor: pid %d, %s, %u recoveries%s%s\n",
             (int) s->supervisor_pid,
             st->supervisor_running ? "running" : "NOT running", s->restarts,
             s->last_failure ? "; last failure: " : "",
             s->last_failure ? s->last_failure : "");
    print_counters (f, st);
    return;
  }
  fprintf (f, "  kernel:  nbd, %s, %u hardware queues, %u connections "
           "attached\n", st->kernel_connected ? "connected" : "NOT connected",
           st->hardware_queues, s->connections);
  if (s->remote) {
    /* No server of ours: the supervisor only reconnects (remote.h). */
    fprintf (f, "  server:  remote; IO waits up to %u s for it while it "
             "is unreachable\n", s->dead_timeout);
    fprintf (f, "  supervisor: pid %d, %s%s%s\n", (int) s->supervisor_pid,
             st->supervisor_running ? "running" : "NOT running",
             s->last_failure ? "; last failure: " : "",
             s->last_failure ? s->last_failure : "");
    fprintf (f, "  reconnects: %u%s%s\n", s->reconnects,
             s->last_reconnect ? "; last: " : "",
             s->last_reconnect ? s->last_reconnect : "");
    return;
  }
  fprintf (f, "  server:  %s, %s %d, %s\n", mloop_state_server_name (s),
           s->server_in_process ? "inside mloopd, pid" : "pid",
           (int) s->server_pid, st->server_running ? "running" : "NOT running");
  if (s->service_kept)
    fprintf (f, "  supervisor: mloopd, %s, %u restarts%s%s\n",
             st->supervisor_running ? "keeping it" : "NOT keeping it",
             s->restarts, s->last_failure ? "; last failure: " : "",
             s->last_failure ? s->last_failure : "");
  else
    fprintf (f, "  supervisor: pid %d, %u restarts%s%s\n",
             (int) s->supervisor_pid, s->restarts,
             s->last_failure ? "; last failure: " : "",
             s->last_failure ? s->last_failure : "");
  fprintf (f, "  reconnects: %u%s%s\n", s->reconnects,
           s->last_reconnect ? "; last: " : "",
           s->last_reconnect ? s->last_reconnect : "");
  print_counters (f, st);
}
