/* Loop devices for the unit tests (loop_device.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/loop.h>

#include "loop_device.h"
#include "unit.h"

int
unit_free_loop (char *node, size_t len)
{
  int control, n;

  if (geteuid () != 0)
    unit_skip ("loop devices need root");
  control = open ("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (control == -1 || (n = ioctl (control, LOOP_CTL_GET_FREE)) < 0)
    unit_skip ("no loop devices: %s", strerror (errno));
  close (control);
  snprintf (node, len, "/dev/loop%d", n);
  return n;
}

int
unit_loop_attach (const char *node, const char *image, bool read_only)
{
  return unit_loop_attach_flags (node, image,
                                 read_only ? LO_FLAGS_READ_ONLY : 0);
}

int
unit_loop_attach_flags (const char *node, const char *image, unsigned flags)
{
  const bool read_only = flags & LO_FLAGS_READ_ONLY;
  const int mode = (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  struct loop_config config;
  int fd, file;

  file = open (image, mode);
  CHECK (file >= 0, "%s: %s", image, strerror (errno));
  fd = open (node, mode);
  CHECK (fd >= 0, "%s: %s", node, strerror (errno));
  memset (&config, 0, sizeof config);
  config.fd = (unsigned) file;
  config.info.lo_flags = LO_FLAGS_AUTOCLEAR | flags;
  /* The last detach may still be finishing. */
  for (int i = 0; ioctl (fd, LOOP_CONFIGURE, &config) == -1; i++) {
    if (errno != EBUSY || i == 100)
      unit_skip ("cannot attach %s to %s: %s", image, node, strerror (errno));
    unit_sleep_ms (20);
  }
  close (file);
  return fd;
}
