/* mloop — the request queue settings of an attached device. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <glib.h>

#include "block_queue.h"
#include "errmsg.h"

static char *
queue_path (const char *dev, const char *name)
{
  return g_strdup_printf ("/sys/block/%s/queue/%s", dev, name);
}

/* Writes VALUE to the queue setting NAME.  sysfs reports a refused value
 * as the write's error, so it is one unbuffered write, checked.
 */
static int
write_setting (const char *dev, const char *name, const char *value,
               char *err, size_t errlen)
{
  g_autofree char *path = queue_path (dev, name);
  int fd = open (path, O_WRONLY | O_CLOEXEC);
  size_t len = strlen (value);
  ssize_t n;

  if (fd == -1)
    return mloop_fail (err, errlen, "queue setting %s: %s%s", name,
                       strerror (errno), errno == ENOENT
                       ? " (no such file in /sys/block/DEVICE/queue)" : "");
  n = write (fd, value, len);
  if (n != (ssize_t) len) {
    int e = n == -1 ? errno : EIO;

    close (fd);
    return mloop_fail (err, errlen, "setting %s to %s on /dev/%s: %s",
                       name, value, dev, strerror (e));
  }
  close (fd);
  return 0;
}

static unsigned
read_setting (const char *dev, const char *name)
{
  g_autofree char *path = queue_path (dev, name);
  g_autofree char *text = NULL;

  return g_file_get_contents (path, &text, NULL, NULL)
    ? (unsigned) strtoul (text, NULL, 10) : 0;
}

/* Whether the queue setting NAME already reads VALUE: a number as
 * written, or the scheduler in use, shown in brackets among the others.
 */
static bool
setting_is (const char *dev, const char *name, const char *value)
{
  g_autofree char *path = queue_path (dev, name);
  g_autofree char *text = NULL;
  g_autofree char *chosen = g_strdup_printf ("[%s]", value);

  if (!g_file_get_contents (path, &text, NULL, NULL))
    return false;
  g_strstrip (text);
  return strcmp (text, value) == 0 || strstr (text, chosen) != NULL;
}

int
mloop_queue_options_check (char *const *options, char *err, size_t errlen)
{
  for (char *const *o = options; o && *o; o++) {
    const char *eq = strchr (*o, '=');
    g_autofree char *name = eq ? g_strndup (*o, (gsize) (eq - *o)) : NULL;

    if (name == NULL || *name == '\0' || eq[1] == '\0')
      return mloop_fail (err, errlen, "--queue-option %s: must be NAME=VALUE "
                         "(a file of /sys/block/DEVICE/queue)", *o);
    if (strchr (name, '/') || strcmp (name, ".") == 0 ||
        strcmp (name, "..") == 0)
      return mloop_fail (err, errlen, "--queue-option %s: %s is not a queue "
                         "setting's name", *o, name);
  }
  return 0;
}

/* The largest request: MLOOP_QUEUE_MAX_REQUEST_KB, but no more than the
 * device (max_hw_sectors_kb) or the server (its maximum block size) take.
 */
static unsigned
max_request_kb (const char *dev, uint32_t server_max_request)
{
  unsigned kb = MLOOP_QUEUE_MAX_REQUEST_KB;
  unsigned hw = read_setting (dev, "max_hw_sectors_kb");

  if (hw && hw < kb)
    kb = hw;
  if (server_max_request && server_max_request / 1024 < kb)
    kb = server_max_request / 1024;
  return kb < 4 ? 4 : kb;
}

int
mloop_queue_apply_options (const char *dev, char *const *options,
                           char *err, size_t errlen)
{
  for (char *const *o = options; o && *o; o++) {
    const char *eq = strchr (*o, '=');
    g_autofree char *name = g_strndup (*o, (gsize) (eq - *o));

    if (write_setting (dev, name, eq + 1, err, errlen) == -1)
      return -1;
  }
  return 0;
}

int
mloop_queue_configure (const char *dev, const struct mloop_queue_plan *p,
                       char *err, size_t errlen)
{
  g_autofree char *depth = g_strdup_printf ("%u", p->depth);
  g_autofree char *request = g_strdup_printf ("%u", max_request_kb (
                                                dev, p->server_max_request));
  g_autofree char *ahead = g_strdup_printf ("%u", MLOOP_QUEUE_READ_AHEAD_KB);
  /* The scheduler first: choosing one sets nr_requests afresh. */
  const char *const ours[][2] = {
    { "scheduler", "none" },
    { "nr_requests", depth },
    { "max_sectors_kb", request },
    { "read_ahead_kb", ahead },
  };

  /* Only what differs: writing the scheduler or nr_requests freezes the
   * queue (an RCU grace period) even to the value it has, and the
   * kernel's defaults for a device of several queues are often ours.
   */
  for (size_t i = 0; i < G_N_ELEMENTS (ours); i++)
    if (!setting_is (dev, ours[i][0], ours[i][1]) &&
        write_setting (dev, ours[i][0], ours[i][1], err, errlen) == -1)
      return -1;
  return mloop_queue_apply_options (dev, p->options, err, errlen);
}
