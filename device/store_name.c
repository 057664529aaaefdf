/* mloop — names of images that are not local files.  See store_name.h. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/stat.h>

#include <glib.h>

#include "ceph_conf.h"
#include "engine.h"
#include "errmsg.h"
#include "store_name.h"
#include "trusted_path.h"

bool
mloop_is_rbd_name (const char *name)
{
  return g_str_has_prefix (name, MLOOP_RBD_PREFIX);
}

/* PATH made absolute as this process opens it: after the working
 * directory (as the kernel has it, no link in it) when relative, its
 * ".." left as spelt.  Taken away from the spelling alone (glib's
 * canonical name), "link/../ceph.conf" would be the link's neighbour,
 * where the kernel, librados and the rbd tool go up from the link's
 * target: the servers would read another file, another cluster's
 * configuration perhaps, than the one the caller named or the search
 * found.  NULL, no memory or no working directory.
 */
static char *
absolute_as_opened (const char *path)
{
  char *cwd, *abs;

  if (g_path_is_absolute (path))
    return g_strdup (path);
  if ((cwd = getcwd (NULL, 0)) == NULL)
    return NULL;
  abs = g_build_filename (cwd, path, NULL);
  free (cwd);
  return abs;
}

char *
mloop_rbd_name_with (const char *name, const char *conf, const char *id,
                     char *err, size_t errlen)
{
  g_autofree char *abs_conf = conf ? absolute_as_opened (conf) : NULL;

  if (!mloop_is_rbd_name (name)) {
    mloop_fail (err, errlen, "--ceph-conf and --ceph-id are for RBD "
                "images (rbd:POOL/IMAGE), not %s", name);
    return NULL;
  }
  if (conf && abs_conf == NULL) {
    mloop_fail (err, errlen, "--ceph-conf %s: cannot make it absolute: %s",
                conf, strerror (errno));
    return NULL;
  }
  if ((abs_conf && strchr (abs_conf, ':')) || (id && strchr (id, ':'))) {
    mloop_fail (err, errlen, "--ceph-conf and --ceph-id may not contain "
                "':' (it separates a name's options)");
    return NULL;
  }
  if (id && strchr (id, '/')) {
    mloop_fail (err, errlen, "--ceph-id %s: a cephx user's name has no "
                "'/'", id);
    return NULL;
  }
  return g_strconcat (name, abs_conf ? ":conf=" : "", abs_conf ? abs_conf : "",
                      id ? ":id=" : "", id ? id : "", NULL);
}

/* NAME's options (g_strfreev them): what follows the image's spec,
 * ':'-separated, as "KEY=VALUE"; NULL when it has none.
 */
static char **
options_of (const char *name)
{
  const char *options = strchr (name + strlen (MLOOP_RBD_PREFIX), ':');

  return options ? g_strsplit (options + 1, ":", -1) : NULL;
}

int
mloop_rbd_name_check (const char *name, char *err, size_t errlen)
{
  g_auto (GStrv) each = NULL;

  if (!mloop_is_rbd_name (name))
    return 0;
  each = options_of (name);
  for (char **o = each; o && *o; o++) {
    if (g_str_has_prefix (*o, "conf=") && (*o)[strlen ("conf=")] != '/')
      return mloop_fail (err, errlen, "%s: %s is relative, and a device's "
                         "servers run in /: give the configuration's "
                         "absolute path (or --ceph-conf)", name, *o);
    /* A configuration's paths take the user's name ($id, $name): one
     * with a '/' would lead them out of their directory.
     */
    if (g_str_has_prefix (*o, "id=") && strchr (*o, '/'))
      return mloop_fail (err, errlen, "%s: %s: a cephx user's name has no "
                         "'/'", name, *o);
  }
  return 0;
}

/* Whether NAME's options name a configuration (conf=). */
static bool
names_conf (const char *name)
{
  g_auto (GStrv) each = options_of (name);

  for (char **o = each; o && *o; o++)
    if (g_str_has_prefix (*o, "conf="))
      return true;
  return false;
}

/* Whether CONF, the configuration a device records, leads where only
 * trusted users can change it: each of the device's servers (root's)
 * opens it again by name, and a user who could rename an entry on the
 * way could lead a later one to another file root owns, another
 * cluster's configuration.
 */
static bool
conf_path_trusted_as (const char *conf, char *err, size_t errlen)
{
  char why[1024];

  if (mloop_path_trusted (conf, why, sizeof why))
    return true;
  mloop_fail (err, errlen, "Ceph configuration %s: keep it where only root "
              "may change it", why);
  return false;
}

/* conf_path_trusted_as for the conf= NAME's options give. */
static bool
conf_path_trusted (const char *name, char *err, size_t errlen)
{
  g_auto (GStrv) each = options_of (name);

  for (char **o = each; o && *o; o++)
    if (g_str_has_prefix (*o, "conf=") &&
        !conf_path_trusted_as (*o + strlen ("conf="), err, errlen))
      return false;
  return true;
}

char *
mloop_rbd_name_pinned (const char *name, char *err, size_t errlen)
{
  /* What librados takes from the environment besides $CEPH_CONF: its
   * options, its keyring, its plugins' directory.
   */
  static const char *const unseen[] = {
    "CEPH_ARGS", "CEPH_KEYRING", "CEPH_LIB"
  };
  g_autofree char *abs = NULL;
  char *cluster;
  char *found = NULL;
  struct stat sb;
  int fd;

  for (size_t i = 0; i < G_N_ELEMENTS (unseen); i++)
    if (getenv (unseen[i]) && *getenv (unseen[i])) {
      mloop_fail (err, errlen, "%s is set, and reaches none of the "
                  "device's servers (mloopd's, a restart's): give the "
                  "user with --ceph-id and the rest in the configuration "
                  "file", unseen[i]);
      return NULL;
    }
  if (names_conf (name))
    return conf_path_trusted (name, err, errlen) ? g_strdup (name) : NULL;
  /* None found, or one the store cannot judge: refused here, not left to
   * the servers, which search again elsewhere (mloopd's environment,
   * without this $CEPH_CONF, in /) and could find another cluster's
   * configuration, /etc/ceph/ceph.conf, and serve its image of that
   * name.
   */
  if ((fd = mloop_ceph_conf_open_searched (&found)) < 0) {
    const char *list = getenv ("CEPH_CONF");

    if (fd == -ENOTSUP)
      mloop_fail (err, errlen, "$CEPH_CONF's %s: only $cluster and $home "
                  "are understood there: name the configuration with "
                  "--ceph-conf", found);
    else if (fd == -ENOENT)
      mloop_fail (err, errlen, "no Ceph configuration found here (%s%s): "
                  "the device's servers would look for one elsewhere; name "
                  "it with --ceph-conf", list ? "$CEPH_CONF: " :
                  "/etc/ceph/ceph.conf, ~/.ceph/ceph.conf, ./ceph.conf",
                  list ? list : "");
    else
      mloop_fail (err, errlen, "looking for the Ceph configuration: %s",
                  strerror (-fd));
    free (found);
    return NULL;
  }
  /* librados would read it, a FIFO or a device, and search no further;
   * no server reads one.
   */
  if (fstat (fd, &sb) < 0 || !S_ISREG (sb.st_mode)) {
    mloop_fail (err, errlen, "%s, the Ceph configuration librados's search "
                "finds here, is no regular file: name one with --ceph-conf",
                found);
    close (fd);
    free (found);
    return NULL;
  }
  close (fd);
  abs = absolute_as_opened (found);
  if (abs == NULL) {
    mloop_fail (err, errlen, "%s, the Ceph configuration found: cannot "
                "make it absolute: %s", found, strerror (errno));
    free (found);
    return NULL;
  }
  free (found);
  if (strchr (abs, ':')) {
    mloop_fail (err, errlen, "%s, the Ceph configuration found, has a ':' "
                "in its path (it separates a name's options): name another "
                "with --ceph-conf", abs);
    return NULL;
  }
  /* librados calls the cluster of a file its search finds "ceph", and
   * that of a file named after the file ("backup.conf": backup), as the
   * servers, given it as conf=, would: another keyring
   * (/etc/ceph/$cluster.$name.keyring), log and admin socket than this
   * environment's.  Refused where the two differ, not recorded.
   */
  if ((cluster = mloop_ceph_cluster_name (abs)) == NULL) {
    mloop_fail (err, errlen, "out of memory");
    return NULL;
  }
  if (strcmp (cluster, "ceph") != 0) {
    mloop_fail (err, errlen, "%s, the Ceph configuration found, is the "
                "cluster ceph's where librados's search finds it but the "
                "cluster %s's where it is named, as the device's servers "
                "are given it: name it with --ceph-conf", abs, cluster);
    free (cluster);
    return NULL;
  }
  free (cluster);
  return conf_path_trusted_as (abs, err, errlen)
    ? g_strconcat (name, ":conf=", abs, NULL) : NULL;
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
