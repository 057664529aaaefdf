/* mloop — how `mloop list` and `mloop status` print, as a table or JSON.
 *
 * JSON is written by hand: glib has no JSON writer, the output is a few
 * flat objects, and json-glib would be a dependency for one function.
 */
#include <inttypes.h>
#include <stdio.h>

#include <glib.h>

#include "print.h"

/* A JSON string literal, escaped per RFC 8259. */
static void
json_string (FILE *f, const char *s)
{
  fputc ('"', f);
  for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf (f, "\\%c", *p);
    else if (*p < 0x20)
      fprintf (f, "\\u%04x", *p);
    else
      fputc (*p, f);
  }
  fputc ('"', f);
}

static void
json_device (FILE *f, const struct mloop_device_state *s)
{
  g_autofree char *sock = mloop_state_path (s, MLOOP_DIR_SOCKET);

  fprintf (f, "{\"device\": \"/dev/nbd%d\", \"file\": ", s->index);
  json_string (f, s->file);
  fprintf (f, ", \"size\": %" PRIu64 ", \"block_size\": %" PRIu32
           ", \"read_only\": %s, \"connections\": %u, \"threads\": %u"
           ", \"server\": \"%s\", \"server_pid\": %d, \"socket\": ",
           s->size, s->block_size, s->read_only ? "true" : "false",
           s->connections, s->threads, mloop_state_server_name (s),
           (int) s->server_pid);
  json_string (f, sock);
  fputc ('}', f);
}

void
mloop_print_list (FILE *f, const struct mloop_device_state *list, size_t n,
                  bool json)
{
  if (json) {
    fputc ('[', f);
    for (size_t i = 0; i < n; i++) {
      fputs (i ? ",\n " : "", f);
      json_device (f, &list[i]);
    }
    fputs ("]\n", f);
    return;
  }
  if (n == 0)
    return;                     /* like losetup --list: silence */
  fprintf (f, "%-12s %14s %2s %5s %7s %-6s %7s %s\n", "DEVICE", "SIZE",
           "RO", "CONNS", "THREADS", "SERVER", "PID", "BACK-FILE");
  for (size_t i = 0; i < n; i++) {
    const struct mloop_device_state *s = &list[i];
    g_autofree char *dev = g_strdup_printf ("/dev/nbd%d", s->index);

    fprintf (f, "%-12s %14" PRIu64 " %2d %5u %7u %-6s %7d %s\n", dev,
             s->size, s->read_only, s->connections, s->threads,
             mloop_state_server_name (s), (int) s->server_pid,
             s->file);
  }
}

void
mloop_print_status (FILE *f, const struct mloop_device_state *s,
                    const struct mloop_device_status *st, bool json)
{
  const struct mloop_stats *c = &st->stats;

  if (json) {
    fputs ("{\"device\": ", f);
    json_device (f, s);
    fprintf (f, ", \"server_running\": %s, \"kernel_connected\": %s"
             ", \"hardware_queues\": %u, \"supervisor_pid\": %d"
             ", \"restarts\": %u, \"last_failure\": ",
             st->server_running ? "true" : "false",
             st->kernel_connected ? "true" : "false", st->hardware_queues,
             (int) s->supervisor_pid, s->restarts);
    if (s->last_failure)
      json_string (f, s->last_failure);
    else
      fputs ("null", f);
    if (st->have_stats) {
      fprintf (f, ", \"connections_open\": %" PRIu64
               ", \"connections_total\": %" PRIu64 ", \"requests\": {",
               c->connections, c->connections_total);
      for (int i = 0; i < MLOOP_STATS_NR_COMMANDS; i++)
        fprintf (f, "%s\"%s\": %" PRIu64, i ? ", " : "",
                 mloop_stats_command_name (i), c->requests[i]);
      fprintf (f, "}, \"bytes_read\": %" PRIu64 ", \"bytes_written\": %"
               PRIu64 ", \"errors\": %" PRIu64 ", \"in_flight\": %" PRIu64,
               c->bytes_read, c->bytes_written, c->errors, c->in_flight);
    }
    fputs ("}\n", f);
    return;
  }
  fprintf (f, "/dev/nbd%d: %s\n", s->index, s->file);
  fprintf (f, "  kernel:  %s, %u hardware queues, %u connections attached\n",
           st->kernel_connected ? "connected" : "NOT connected",
           st->hardware_queues, s->connections);
  if (s->remote) {
    fprintf (f, "  server:  remote, not supervised\n");
    return;
  }
  fprintf (f, "  server:  %s, pid %d, %s\n", mloop_state_server_name (s),
           (int) s->server_pid, st->server_running ? "running" : "NOT running");
  fprintf (f, "  supervisor: pid %d, %u restarts%s%s\n", (int) s->supervisor_pid,
           s->restarts, s->last_failure ? "; last failure: " : "",
           s->last_failure ? s->last_failure : "");
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
