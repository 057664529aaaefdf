/* mloop — the partitions of an attached /dev/nbdN. */
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
open_device (int index, char *err, size_t errlen)
{
  g_autofree char *path = g_strdup_printf ("/dev/nbd%d", index);
  int fd = open (path, O_RDONLY | O_CLOEXEC);

  if (fd == -1)
    mloop_fail (err, errlen, "%s: %s", path, strerror (errno));
  return fd;
}

int
mloop_partitions_scan (int index, char *err, size_t errlen)
{
  int fd = open_device (index, err, errlen);
  int r = 0;

  if (fd == -1)
    return -1;
  /* EINVAL: the module gave the device no minors for partitions. */
  if (ioctl (fd, BLKRRPART) == -1 && errno != EINVAL)
    r = mloop_fail (err, errlen, "/dev/nbd%d: reading the partition table: "
                    "%s", index, strerror (errno));
  close (fd);
  return r;
}

/* The partition numbers of /dev/nbdINDEX, from sysfs: each partition is
 * a directory /sys/block/nbdINDEX/nbdINDEXpK holding its number.
 */
static GArray *
partition_numbers (int index)
{
  g_autofree char *dir_path = g_strdup_printf ("/sys/block/nbd%d", index);
  g_autofree char *prefix = g_strdup_printf ("nbd%dp", index);
  GArray *numbers = g_array_new (FALSE, FALSE, sizeof (int));
  GDir *dir = g_dir_open (dir_path, 0, NULL);
  const char *name;

  while (dir && (name = g_dir_read_name (dir))) {
    const char *digits = name + strlen (prefix);
    int k;

    if (!g_str_has_prefix (name, prefix) || !g_ascii_isdigit (*digits))
      continue;
    k = atoi (digits);
    g_array_append_val (numbers, k);
  }
  if (dir)
    g_dir_close (dir);
  return numbers;
}

unsigned
mloop_partitions_count (int index)
{
  g_autoptr (GArray) numbers = partition_numbers (index);

  return numbers->len;
}

int
mloop_partitions_drop (int index, char *err, size_t errlen)
{
  g_autoptr (GArray) numbers = partition_numbers (index);
  int fd, r = 0;

  if (numbers->len == 0)
    return 0;
  fd = open_device (index, err, errlen);
  if (fd == -1)
    return -1;
  for (guint i = 0; i < numbers->len && r == 0; i++) {
    struct blkpg_partition part = { .pno = g_array_index (numbers, int, i) };
    struct blkpg_ioctl_arg arg = {
      .op = BLKPG_DEL_PARTITION, .datalen = sizeof part, .data = &part,
    };

    if (ioctl (fd, BLKPG, &arg) == -1 && errno != ENXIO)
      r = mloop_fail (err, errlen, "/dev/nbd%dp%d: %s", index, part.pno,
                      errno == EBUSY ? "in use" : strerror (errno));
  }
  close (fd);
  return r;
}
