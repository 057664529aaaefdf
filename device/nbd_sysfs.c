/* mloop — what /sys/block shows of an NBD device, read one way. */
#include <string.h>

#include <glib.h>

#include "nbd_sysfs.h"

char *
mloop_nbd_sysfs_backend (const char *sys_block, int index)
{
  g_autofree char *path = g_strdup_printf ("%s/nbd%d/backend", sys_block,
                                           index);
  char *backend = NULL;

  if (!g_file_get_contents (path, &backend, NULL, NULL))
    return NULL;
  /* The kernel ends it with one newline; another tool's identifier may
   * hold anything else, which is kept to be compared.
   */
  if (g_str_has_suffix (backend, "\n"))
    backend[strlen (backend) - 1] = '\0';
  return backend;
}

bool
mloop_nbd_sysfs_started (int index)
{
  g_autofree char *path = g_strdup_printf ("/sys/block/nbd%d/pid", index);

  return g_file_test (path, G_FILE_TEST_EXISTS);
}
