/* A device's state file (device/device_state.c) reads back as it was
 * written, every field, and only into a directory of its own: the
 * runtime directory and device directories are private (0700), the file
 * 0600, and a directory without one, or with a file naming no image,
 * reads as no device at all.  In a temporary MLOOP_RUNTIME_DIR, so no
 * root is needed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <glib.h>

#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

static unsigned
mode_of (const char *path)
{
  struct stat st;

  CHECK (stat (path, &st) == 0, "%s: %s", path, strerror (errno));
  return st.st_mode & 07777;
}

int
main (void)
{
  g_autofree char *run = g_build_filename (unit_tmpdir ("/tmp"), "run", NULL);
  g_autofree char *state_path = NULL;
  struct mloop_device_state s = {
    .index = 7,
    .file = "/var/lib/images/disk with spaces.img",
    .file_dev = UINT64_C (0x10302), .file_ino = UINT64_C (1) << 40,
    .file_rdev = UINT64_C (0x700003),
    .offset = (UINT64_C (3) << 40) + 4096, .sizelimit = UINT64_C (1) << 41,
    .size = (UINT64_C (5) << 40) + 123,
    .block_size = 4096,
    .read_only = true,
    .connections = 16, .threads = 9,
    .timeout = 45, .dead_timeout = 120, .export_flags = 0x12d,
    .server = mloop_server_kind_find ("nbdkit", NULL, 0),
    .server_pid = 4242, .supervisor_pid = 4141, .service_kept = true,
  };
  struct mloop_device_state got;
  char err[256];

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  CHECK (strcmp (mloop_runtime_dir (), run) == 0, "runtime dir %s",
         mloop_runtime_dir ());
  CHECK (mloop_state_create (&s, err, sizeof err) == 0, "create: %s", err);
  CHECK (g_str_has_prefix (s.dir, run), "device dir %s outside %s", s.dir,
         run);
  CHECK (mode_of (run) == 0700, "%s mode %o", run, mode_of (run));
  CHECK (mode_of (s.dir) == 0700, "%s mode %o", s.dir, mode_of (s.dir));

  /* Before the state is saved: an attach in progress, no device. */
  CHECK (mloop_state_load (s.dir, &got) == -1, "loaded a state never saved");
  mloop_state_clear (&got);

  CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);
  state_path = mloop_state_path (&s, MLOOP_DIR_STATE);
  CHECK (mode_of (state_path) == 0600, "%s mode %o", state_path,
         mode_of (state_path));

  CHECK (mloop_state_load (s.dir, &got) == 0, "load of %s failed", s.dir);
  CHECK (strcmp (got.dir, s.dir) == 0, "dir %s", got.dir);
  CHECK (got.index == s.index, "index %d", got.index);
  CHECK (got.file && strcmp (got.file, s.file) == 0, "file %s", got.file);
  CHECK (got.file_dev == s.file_dev && got.file_ino == s.file_ino,
         "file identity %llx:%llu", (unsigned long long) got.file_dev,
         (unsigned long long) got.file_ino);
  CHECK (got.file_rdev == s.file_rdev, "block device %llx",
         (unsigned long long) got.file_rdev);
  CHECK (got.size == s.size, "size %llu", (unsigned long long) got.size);
  CHECK (got.offset == s.offset && got.sizelimit == s.sizelimit,
         "window %llu+%llu", (unsigned long long) got.offset,
         (unsigned long long) got.sizelimit);
  CHECK (got.block_size == s.block_size, "block size %u", got.block_size);
  CHECK (got.read_only == s.read_only, "read_only %d", got.read_only);
  CHECK (got.connections == s.connections, "connections %u", got.connections);
  CHECK (got.threads == s.threads, "threads %u", got.threads);
  CHECK (got.timeout == s.timeout, "timeout %u", got.timeout);
  CHECK (got.dead_timeout == s.dead_timeout, "dead timeout %u",
         got.dead_timeout);
  CHECK (got.export_flags == s.export_flags, "export flags 0x%x",
         got.export_flags);
  CHECK (got.server == s.server, "server kind %s",
         got.server ? got.server->name : "(none)");
  CHECK (!got.remote, "a local device read back as remote");
  CHECK (got.server_pid == s.server_pid, "server pid %d", (int) got.server_pid);
  CHECK (got.supervisor_pid == s.supervisor_pid, "supervisor pid %d",
         (int) got.supervisor_pid);
  CHECK (got.service_kept, "a device mloopd keeps was read as one a "
         "supervisor keeps");
  /* No supervisor record yet: nothing restarted or reconnected. */
  CHECK (got.restarts == 0 && got.last_failure == NULL,
         "restarts %u, last failure %s", got.restarts, got.last_failure);
  CHECK (got.reconnects == 0 && got.last_reconnect == NULL,
         "reconnects %u, last reconnect %s", got.reconnects,
         got.last_reconnect);
  mloop_state_clear (&got);

  /* Saving again replaces the file whole. */
  s.index = 0;
  s.read_only = false;
  CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);
  CHECK (mloop_state_load (s.dir, &got) == 0, "second load failed");
  CHECK (got.index == 0 && !got.read_only, "second load: index %d, ro %d",
         got.index, got.read_only);
  mloop_state_clear (&got);

  /* A state written before dead timeouts had their own key: the
   * request timeout was the dead-connection timeout too.
   */
  CHECK (g_file_set_contents (state_path, "[device]\nindex=3\nfile=/i\n"
                              "timeout=17\n", -1, NULL),
         "rewriting %s", state_path);
  CHECK (mloop_state_load (s.dir, &got) == 0, "load of an older state");
  CHECK (got.dead_timeout == 17, "older state: dead timeout %u",
         got.dead_timeout);
  mloop_state_clear (&got);

  /* A state naming no image is not a device. */
  CHECK (g_file_set_contents (state_path, "[device]\nindex=3\n", -1, NULL),
         "rewriting %s", state_path);
  CHECK (mloop_state_load (s.dir, &got) == -1, "loaded a state with no file");
  mloop_state_clear (&got);

  g_free (s.dir);
  printf ("ok: device state written and read back\n");
  return 0;
}
