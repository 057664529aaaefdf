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

char *
mloop_image_identity (const char *name)
{
  const char *options = mloop_is_rbd_name (name)
    ? strchr (name + strlen (MLOOP_RBD_PREFIX), ':') : NULL;

  return options ? g_strndup (name, (gsize) (options - name))
    : g_strdup (name);
}
