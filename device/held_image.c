/* mloop — an image reached through a descriptor (held_image.h). */
#include <string.h>

#include "held_image.h"

static int held_fd = -1;

void
mloop_held_image_set (int fd)
{
  held_fd = fd;
}

int
mloop_held_image_fd (void)
{
  return held_fd;
}

bool
mloop_is_held_image (const char *image)
{
  return image && strcmp (image, MLOOP_HELD_IMAGE_PATH) == 0;
}
