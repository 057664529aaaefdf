/* The supervisor's record (device/device_state.c) overrides the state
 * file's server pid when it names one, and adds the restarts and the
 * last failure, the reconnects (connections the kernel dropped while the
 * server lived) and why the last was dropped; it is a file of its own,
 * so rewriting it leaves the device's state as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

int
main (void)
{
  g_autofree char *run = g_build_filename (unit_tmpdir ("/tmp"), "run", NULL);
  struct mloop_device_state s = {
    .index = 2, .file = "/images/a.img", .size = 1 << 20,
    .block_size = 512, .connections = 1, .threads = 1, .timeout = 30,
    .server = mloop_server_kind_find ("native", NULL, 0), .server_pid = 100, .supervisor_pid = 99,
  };
  struct mloop_device_state got;
  char err[256];

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  CHECK (mloop_state_create (&s, err, sizeof err) == 0, "create: %s", err);
  CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);

  /* The server restarted twice; the last one died of a signal.  The
   * kernel dropped five connections of the live server.
   */
  struct mloop_supervisor_record r = {
    .server_pid = 300, .restarts = 2, .last_failure = "killed by signal 9",
    .reconnects = 5, .last_reconnect = "request timeout",
  };
  CHECK (mloop_state_save_supervisor (s.dir, &r, err, sizeof err) == 0,
         "save supervisor: %s", err);
  CHECK (mloop_state_load (s.dir, &got) == 0, "load failed");
  CHECK (got.server_pid == 300, "server pid %d, the supervisor said 300",
         (int) got.server_pid);
  CHECK (got.supervisor_pid == 99, "supervisor pid %d", (int) got.supervisor_pid);
  CHECK (got.restarts == 2, "restarts %u", got.restarts);
  CHECK (got.last_failure && strcmp (got.last_failure, "killed by signal 9") == 0,
         "last failure %s", got.last_failure);
  CHECK (got.reconnects == 5, "reconnects %u", got.reconnects);
  CHECK (got.last_reconnect && strcmp (got.last_reconnect,
                                       "request timeout") == 0,
         "last reconnect %s", got.last_reconnect);
  CHECK (got.index == 2 && strcmp (got.file, "/images/a.img") == 0,
         "the state was changed: index %d, file %s", got.index, got.file);
  mloop_state_clear (&got);

  /* Between a server's death and its successor: no pid, the state's
   * stands; no failure recorded, none reported.
   */
  r = (struct mloop_supervisor_record) { .server_pid = 0, .restarts = 3 };
  CHECK (mloop_state_save_supervisor (s.dir, &r, err, sizeof err) == 0,
         "save supervisor: %s", err);
  CHECK (mloop_state_load (s.dir, &got) == 0, "load failed");
  CHECK (got.server_pid == 100, "server pid %d, the state said 100",
         (int) got.server_pid);
  CHECK (got.restarts == 3, "restarts %u", got.restarts);
  CHECK (got.last_failure == NULL, "last failure %s", got.last_failure);
  CHECK (got.reconnects == 0 && got.last_reconnect == NULL,
         "reconnects %u, last reconnect %s", got.reconnects,
         got.last_reconnect);
  mloop_state_clear (&got);

  g_free (s.dir);
  printf ("ok: the supervisor's record overrides the server pid\n");
  return 0;
}
