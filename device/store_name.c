/* mloop — names of images that are not local files.  See store_name.h. */
#include <stddef.h>
#include <string.h>

#include <glib.h>

#include "engine.h"
#include "errmsg.h"
#include "store_name.h"

bool
mloop_is_rbd_name (const char *name)
{
  return g_str_has_prefix (name, MLOOP_RBD_PREFIX);
}

char *
mloop_rbd_name_with (const char *name, const char *conf, const char *id,
                     char *err, size_t errlen)
{
  g_autofree char *abs_conf = conf ? g_canonicalize_filename (conf, NULL)
    : NULL;

  if (!mloop_is_rbd_name (name)) {
    mloop_fail (err, errlen, "--ceph-conf and --ceph-id are for RBD "
                "images (rbd:POOL/IMAGE), not %s", name);
    return NULL;
  }
  if ((abs_conf && strchr (abs_conf, ':')) || (id && strchr (id, ':'))) {
    mloop_fail (err, errlen, "--ceph-conf and --ceph-id may not contain "
                "':' (it separates a name's options)");
    return NULL;
  }
  return g_strconcat (name, abs_conf ? ":conf=" : "", abs_conf ? abs_conf : "",
                      id ? ":id=" : "", id ? id : "", NULL);
}

int
mloop_rbd_name_check (const char *name, char *err, size_t errlen)
{
  const char *options = strchr (name + strlen (MLOOP_RBD_PREFIX), ':');
  g_auto (GStrv) each = NULL;

  if (!mloop_is_rbd_name (name) || options == NULL)
    return 0;
  each = g_strsplit (options + 1, ":", -1);
  for (char **o = each; *o; o++)
    if (g_str_has_prefix (*o, "conf=") && (*o)[strlen ("conf=")] != '/')
      return mloop_fail (err, errlen, "%s: %s is relative, and a device's "
                         "servers run in /: give the configuration's "
                         "absolute path (or --ceph-conf)", name, *o);
  return 0;
}

char *
mloop_image_identity (const char *name)
{
  const char *spec = name + strlen (MLOOP_RBD_PREFIX);
  const char *options;
  g_autofree char *image = NULL;

  if (!mloop_is_rbd_name (name))
    return g_strdup (name);
  options = strchr (spec, ':');
  image = options ? g_strndup (spec, (gsize) (options - spec))
    : g_strdup (spec);
  /* "rbd:IMAGE" is the default pool's: one image with rbd:rbd/IMAGE. */
  return strchr (image, '/')
    ? g_strconcat (MLOOP_RBD_PREFIX, image, NULL)
    : g_strconcat (MLOOP_RBD_PREFIX, MLOOP_RBD_DEFAULT_POOL, "/", image, NULL);
}
