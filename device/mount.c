/* mloop — mounting an image in one step, as `mount -o loop` does. */
#include <stdlib.h>
#include <string.h>

#include <glib.h>

#include "attach.h"
#include "autoclear.h"
#include "errmsg.h"
#include "mount.h"

void
mloop_mount_parse_options (struct mloop_mount_request *req)
{
  g_auto (GStrv) opts = g_strsplit (req->options ? req->options : "", ",",
                                    -1);

  for (char **o = opts; *o; o++) {
    if (strcmp (*o, "ro") == 0)
      req->attach.read_only = true;
    else if (strcmp (*o, "rw") == 0)
      req->attach.read_only = false;
  }
}

/* Runs ARGV (mount or umount); on failure says what it printed. */
static int
run (const char *const *argv, char *err, size_t errlen)
{
  g_autofree char *out = NULL, *errout = NULL;
  g_autoptr (GError) e = NULL;
  int status;

  if (!g_spawn_sync (NULL, (char **) argv, NULL, G_SPAWN_SEARCH_PATH, NULL,
                     NULL, &out, &errout, &status, &e))
    return mloop_fail (err, errlen, "%s: %s", argv[0], e->message);
  if (!g_spawn_check_wait_status (status, NULL)) {
    /* Its first line names the cause; the rest points at dmesg. */
    char *nl = strchr (g_strstrip (errout), '\n');

    if (nl)
      *nl = '\0';
    return mloop_fail (err, errlen, "%s", *errout ? errout
                       : "failed with no message");
  }
  return 0;
}

/* Whether REQ's image is attached and mounted on REQ's directory
 * already (its device's index in *DEVICE_INDEX).  mount(8) compares an
 * fstab line's source with what is mounted, which for an image is its
 * device, so a second `mount -a` asks again: the answer is yes, done.
 */
static bool
already_mounted (const struct mloop_mount_request *req, int *device_index)
{
  struct mloop_device_state st;
  g_autofree char *dev = NULL, *mnt = NULL, *dir = NULL;
  char why[512];
  bool same;

  if (mloop_lookup (req->attach.file, &st, why, sizeof why) == -1)
    return false;
  dev = mloop_state_device_path (&st);
  mnt = mloop_device_mount_point (dev);
  dir = realpath (req->dir, NULL);
  same = mnt && dir && strcmp (mnt, dir) == 0;
  if (same)
    *device_index = st.index;
  mloop_state_clear (&st);
  return same;
}

int
mloop_mount (struct mloop_mount_request *req, int *device_index,
             char *err, size_t errlen)
{
  struct mloop_device_state st;
  g_autofree char *dev = NULL;
  const char *argv[9];
  int n = 0;
  bool mounted;
  char why[512];

  if (!g_file_test (req->dir, G_FILE_TEST_IS_DIR))
    return mloop_fail (err, errlen, "%s: not a directory", req->dir);
  if (already_mounted (req, device_index))
    return 0;
  if (mloop_attach (&req->attach, &st, err, errlen) == -1)
    return -1;
  dev = mloop_state_device_path (&st);
  argv[n++] = "mount";
  if (req->fstype) {
    argv[n++] = "-t";
    argv[n++] = req->fstype;
  }
  if (req->options && *req->options) {
    argv[n++] = "-o";
    argv[n++] = req->options;
  }
  argv[n++] = dev;
  argv[n++] = req->dir;
  argv[n] = NULL;
  /* Autoclear only once mounted: mount(8)'s probing opens and closes
   * the device, which would otherwise detach it.
   */
  mounted = run (argv, err, errlen) == 0;
  if (!mounted || mloop_autoclear_enable (&st, err, errlen) == -1) {
    const char *umount[] = { "umount", req->dir, NULL };

    if (mounted)
      run (umount, why, sizeof why);
    mloop_detach (&st, why, sizeof why);
    mloop_state_clear (&st);
    return -1;
  }
  *device_index = st.index;
  mloop_state_clear (&st);
  return 0;
}

/* The device mounted on DIR, from /proc/self/mounts, or NULL. */
static char *
mounted_device (const char *dir)
{
  g_autofree char *text = NULL;
  g_autofree char *real = realpath (dir, NULL);
  g_auto (GStrv) lines = NULL;
  char *found = NULL;

  if (real == NULL || !g_file_get_contents ("/proc/self/mounts", &text, NULL,
                                            NULL))
    return NULL;
  lines = g_strsplit (text, "\n", -1);
  for (char **l = lines; *l; l++) {
    g_auto (GStrv) f = g_strsplit (*l, " ", 3);

    if (f[0] && f[1] && strcmp (f[1], real) == 0) {
      g_free (found);           /* the last mount on DIR is the visible one */
      found = g_strdup (f[0]);
    }
  }
  return found;
}

/* How long an autoclear device's supervisor may take to clean up: it
 * looks every RELEASE_POLL_MS, then stops the server (SIGTERM, drained).
 */
#define UMOUNT_CLEANUP_TIMEOUT_MS 15000

/* Waits until DIR is gone; false after TIMEOUT_MS. */
static bool
wait_gone (const char *dir, unsigned timeout_ms)
{
  for (unsigned waited = 0; waited < timeout_ms; waited += 50) {
    if (!g_file_test (dir, G_FILE_TEST_EXISTS))
      return true;
    g_usleep (50000);
  }
  return false;
}

int
mloop_umount (const char *dir, char *err, size_t errlen)
{
  g_autofree char *dev = mounted_device (dir);
  const char *argv[] = { "umount", dir, NULL };
  struct mloop_device_state st;
  char why[512];
  int r;

  if (dev == NULL)
    return mloop_fail (err, errlen, "%s: not mounted", dir);
  if (mloop_lookup (dev, &st, why, sizeof why) == -1)
    return mloop_fail (err, errlen, "%s: %s is not an mloop device", dir,
                       dev);
  if (run (argv, err, errlen) == -1) {
    mloop_state_clear (&st);
    return -1;
  }
  /* The kernel is letting an autoclear device go and its supervisor
   * cleans up: wait for that.  Otherwise (and if the supervisor does not
   * finish in time) detach, if the device is still the one unmounted.
   */
  r = 0;
  if (!st.autoclear || !wait_gone (st.dir, UMOUNT_CLEANUP_TIMEOUT_MS)) {
    struct mloop_device_state now;

    if (mloop_lookup (dev, &now, why, sizeof why) == 0) {
      if (strcmp (now.dir, st.dir) == 0)
        r = mloop_detach (&now, err, errlen);
      mloop_state_clear (&now);
    }
  }
  mloop_state_clear (&st);
  return r;
}
