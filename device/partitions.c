/* mloop — the partitions of an attached /dev/nbdN or /dev/ublkbN. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/blkpg.h>
#include <linux/fs.h>

#include <glib.h>

#include "errmsg.h"
#include "partitions.h"

static int
open_device (const char *name, char *err, size_t errlen)
{
  g_autofree char *path = g_strdup_printf ("/dev/%s", name);
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    mloop_fail (err, errlen, "%s: %s", path, strerror (errno));
  return fd;
}

int
mloop_partitions_scan (const char *name, char *err, size_t errlen)
{
  int fd = open_device (name, err, errlen);
  int r = 0;

  if (fd == -1)
    return -1;
  /* EINVAL: the module gave the device no minors for partitions. */
  if (ioctl (fd, BLKRRPART) == -1 && errno != EINVAL)
    r = mloop_fail (err, errlen, "/dev/%s: reading the partition table: "
                    "%s", name, strerror (errno));
  close (fd);
  return r;
}

/* The partition numbers of /dev/NAME, from sysfs: each partition is a
 * directory /sys/block/NAME/NAMEpK holding its number.
 */
static GArray *
partition_numbers (const char *name)
{
  g_autofree char *dir_path = g_strdup_printf ("/sys/block/%s", name);
  g_autofree char *prefix = g_strdup_printf ("%sp", name);
  GArray *numbers = g_array_new (FALSE, FALSE, sizeof (int));
  GDir *dir = g_dir_open (dir_path, 0, NULL);
  const char *entry;

  while (dir && (entry = g_dir_read_name (dir))) {
    const char *digits = entry + strlen (prefix);
    int k;

    if (!g_str_has_prefix (entry, prefix) || !g_ascii_isdigit (*digits))
      continue;
    k = atoi (digits);
    g_array_append_val (numbers, k);
  }
  if (dir)
    g_dir_close (dir);
  return numbers;
}

unsigned
mloop_partitions_count (const char *name)
{
  g_autoptr (GArray) numbers = partition_numbers (name);

  return numbers->len;
}

int
mloop_partitions_drop (const char *name, char *err, size_t errlen)
{
  g_autoptr (GArray) numbers = partition_numbers (name);
  int fd, r = 0;

  if (numbers->len == 0)
    return 0;
  fd = open_device (name, err, errlen);
  if (fd == -1)
    return -1;
  for (guint i = 0; i < numbers->len && r == 0; i++) {
    struct blkpg_partition part = { .pno = g_array_index (numbers, int, i) };
    struct blkpg_ioctl_arg arg = {
      .op = BLKPG_DEL_PARTITION, .datalen = sizeof part, .data = &part,
    };

    if (ioctl (fd, BLKPG, &arg) == -1 && errno != ENXIO)
      r = mloop_fail (err, errlen, "/dev/%sp%d: %s", name, part.pno,
                      errno == EBUSY ? "in use" : strerror (errno));
  }
  close (fd);
  return r;
}
