/* Listing the runtime directory (device/device_state.c): devices with a
 * state file come sorted by device index; directories without one
 * (attaches in progress or abandoned) are listed apart, and anything not
 * named dev-* is neither; an abandoned one is told from one in progress
 * by its lock.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "device_state.h"
#include "server_kind.h"
#include "unit.h"

static char *
make_device (int index, const char *file, bool save)
{
  struct mloop_device_state s = {
    .index = index, .file = (char *) file, .size = 1 << 20,
    .block_size = 512, .connections = 1, .threads = 1,
    .server = mloop_server_kind_default (),
  };
  char err[256];

  CHECK (mloop_state_create (&s, err, sizeof err) == 0, "create: %s", err);
  if (save)
    CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);
  return s.dir;
}

int
main (void)
{
  g_autofree char *run = g_build_filename (unit_tmpdir ("/tmp"), "run", NULL);
  g_autofree char *d5 = NULL, *d1 = NULL, *d3 = NULL, *half = NULL;
  g_autofree char *other = NULL;
  g_auto (GStrv) incomplete = NULL;
  struct mloop_device_state *list;
  size_t n;

  setenv ("MLOOP_RUNTIME_DIR", run, 1);
  /* Nothing there yet, not even the directory. */
  list = mloop_state_list (&n);
  CHECK (n == 0, "%zu devices in a missing runtime dir", n);
  mloop_state_free_list (list, n);

  d5 = make_device (5, "/images/five.img", true);
  d1 = make_device (1, "/images/one.img", true);
  half = make_device (-1, "/images/half.img", false);
  d3 = make_device (3, "/images/three.img", true);
  /* Not a device directory, though it has a state file. */
  other = g_build_filename (run, "not-a-device", NULL);
  CHECK (g_mkdir (other, 0700) == 0, "mkdir %s", other);
  g_autofree char *other_state = g_build_filename (other, MLOOP_DIR_STATE, NULL);
  CHECK (g_file_set_contents (other_state, "[device]\nindex=0\nfile=/x\n", -1,
                              NULL), "writing %s", other_state);

  list = mloop_state_list (&n);
  CHECK (n == 3, "%zu devices listed, expected 3", n);
  CHECK (list[0].index == 1 && list[1].index == 3 && list[2].index == 5,
         "indexes %d, %d, %d: not sorted", list[0].index, list[1].index,
         list[2].index);
  CHECK (strcmp (list[0].dir, d1) == 0 && strcmp (list[0].file,
                                                  "/images/one.img") == 0,
         "device 1: %s, %s", list[0].dir, list[0].file);
  CHECK (strcmp (list[2].dir, d5) == 0, "device 5 in %s", list[2].dir);
  mloop_state_free_list (list, n);

  incomplete = mloop_state_list_incomplete ();
  CHECK (incomplete[0] != NULL && strcmp (incomplete[0], half) == 0,
         "incomplete: %s, expected %s", incomplete[0], half);
  CHECK (incomplete[1] == NULL, "more than one incomplete: %s", incomplete[1]);

  /* What a directory is, told under its lock: an attach that died
   * (no state, its lock free) is handed locked.
   */
  {
    int held = mloop_state_lock_device (half, true), lock;

    CHECK (mloop_state_lock_abandoned (half) == -1 && errno == EWOULDBLOCK,
           "an attach under way taken for dead: %s", strerror (errno));
    mloop_state_unlock (held);
    lock = mloop_state_lock_abandoned (half);
    CHECK (lock != -1, "an attach that died not told: %s", strerror (errno));
    CHECK (mloop_state_lock_device (half, false) == -1 &&
           errno == EWOULDBLOCK, "an attach that died handed unlocked");
    mloop_state_unlock (lock);
    CHECK (mloop_state_lock_abandoned (d1) == -1 && errno == EEXIST,
           "a device made taken for dead: %s", strerror (errno));
  }

  /* Removing one removes it from the list, files and all. */
  mloop_state_remove (d3);
  CHECK (!g_file_test (d3, G_FILE_TEST_EXISTS), "%s still there", d3);
  list = mloop_state_list (&n);
  CHECK (n == 2, "%zu devices after removing one", n);
  mloop_state_free_list (list, n);

  /* Claims: only those of attaches in progress (their lock held) count;
   * a claim nobody holds is an attach that died.
   */
  {
    struct mloop_device_state live = { .index = -1,
                                       .file = (char *) "/images/live.img",
                                       .server = mloop_server_kind_default () };
    struct mloop_device_state dead = live;
    char err[256];
    int lock;

    dead.file = (char *) "/images/dead.img";
    CHECK (mloop_state_create (&live, err, sizeof err) == 0, "%s", err);
    CHECK (mloop_state_create (&dead, err, sizeof err) == 0, "%s", err);
    lock = mloop_state_lock_device (live.dir, true);
    CHECK (lock != -1, "locking %s: %s", live.dir, strerror (errno));
    CHECK (mloop_state_save_claim (&live, err, sizeof err) == 0, "%s", err);
    CHECK (mloop_state_save_claim (&dead, err, sizeof err) == 0, "%s", err);
    CHECK (mloop_state_lock_device (live.dir, false) == -1 &&
           errno == EWOULDBLOCK, "a held device lock was taken again");
    list = mloop_state_list_claims (&n);
    CHECK (n == 1 && strcmp (list[0].file, "/images/live.img") == 0,
           "%zu claims listed (first %s), expected the live one only", n,
           n ? list[0].file : "none");
    mloop_state_free_list (list, n);
    list = mloop_state_list (&n);
    CHECK (n == 2, "claims listed as devices: %zu", n);
    mloop_state_free_list (list, n);
    mloop_state_remove (dead.dir);
    CHECK (mloop_state_lock_device (dead.dir, false) == -1 && errno == ENOENT,
           "locking a removed directory: %s", strerror (errno));
    CHECK (mloop_state_lock_abandoned (dead.dir) == -1 && errno == ENOENT,
           "a removed directory taken for an attach: %s", strerror (errno));
    mloop_state_unlock (lock);
    mloop_state_remove (live.dir);
    g_free (live.dir);
    g_free (dead.dir);
  }

  printf ("ok: devices listed by index, incomplete ones apart, claims "
          "only while held\n");
  return 0;
}
