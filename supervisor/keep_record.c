/* mloopd — what it keeps of a device, on disk (keep_record.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "device_state.h"
#include "keep_record.h"
#include "server_kind.h"

#define GROUP "keep"

/* KF into DIR's record: a temporary file renamed over, so a crash
 * leaves the old record or the new one, never half of one.  The
 * directory is in /run, gone at a power cut with the devices, so only
 * that matters.
 */
static int
save (GKeyFile *kf, const char *dir, char *err, size_t errlen)
{
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_KEEP, NULL);
  g_autoptr (GError) gerr = NULL;

  if (!g_key_file_save_to_file (kf, path, &gerr)) {
    snprintf (err, errlen, "%s", gerr->message);
    return -1;
  }
  return 0;
}

/* A path (any bytes but NUL) as KEY: base64 in KEY64, which survives
 * bytes that are not UTF-8 (g_key_file_get_string refuses them), and
 * as it is in KEY, which an mloopd before KEY64 reads.
 */
static void
set_path (GKeyFile *kf, const char *key, const char *value)
{
  g_autofree char *key64 = g_strconcat (key, "64", NULL);
  g_autofree char *encoded = g_base64_encode ((const guchar *) value,
                                              strlen (value));

  g_key_file_set_string (kf, GROUP, key, value);
  g_key_file_set_string (kf, GROUP, key64, encoded);
}

/* KEY's path into *VALUE: from KEY64 when there is one, else from KEY
 * (a record an mloopd before KEY64 wrote).  1, 0 when neither is there
 * (*VALUE NULL), -1 when one is there but cannot be read: a broken
 * record, never a path left out.
 */
static int
get_path (GKeyFile *kf, const char *key, char **value)
{
  g_autofree char *key64 = g_strconcat (key, "64", NULL);
  g_autofree char *encoded = NULL;
  guchar *decoded;
  gsize n;

  *value = NULL;
  if (g_key_file_has_key (kf, GROUP, key64, NULL)) {
    encoded = g_key_file_get_string (kf, GROUP, key64, NULL);
    if (encoded == NULL)
      return -1;
    decoded = g_base64_decode (encoded, &n);
    /* What g_base64_decode makes of text that is not base64, or a path
     * with a NUL in it, is no path.
     */
    if (decoded == NULL || n == 0 || memchr (decoded, '\0', n)) {
      g_free (decoded);
      return -1;
    }
    *value = g_realloc (decoded, n + 1);
    (*value)[n] = '\0';
    return 1;
  }
  if (!g_key_file_has_key (kf, GROUP, key, NULL))
    return 0;
  *value = g_key_file_get_string (kf, GROUP, key, NULL);
  return *value ? 1 : -1;
}

int
keep_record_save (const char *dir, const struct mloop_server_spec *spec,
                  char *err, size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *offset = g_strdup_printf ("%" PRIu64, spec->offset);
  g_autofree char *sizelimit = g_strdup_printf ("%" PRIu64, spec->sizelimit);

  g_key_file_set_string (kf, GROUP, "server", spec->kind->name);
  set_path (kf, "image", spec->image);
  if (spec->overlay)
    set_path (kf, "overlay", spec->overlay);
  g_key_file_set_string (kf, GROUP, "offset", offset);
  g_key_file_set_string (kf, GROUP, "sizelimit", sizelimit);
  g_key_file_set_integer (kf, GROUP, "threads", (gint) spec->threads);
  g_key_file_set_boolean (kf, GROUP, "read_only", spec->read_only);
  g_key_file_set_boolean (kf, GROUP, "in_process", spec->in_process);
  g_key_file_set_integer (kf, GROUP, "io_timeout", (gint) spec->io_timeout);
  return save (kf, dir, err, errlen);
}

int
keep_record_save_remote (const char *dir, const char *uri, char *err,
                         size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();

  set_path (kf, "remote", uri);
  return save (kf, dir, err, errlen);
}

int
keep_record_load (const char *dir, struct mloop_server_spec *spec,
                  char **remote, char *err, size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_KEEP, NULL);
  g_autofree char *kind = NULL, *offset = NULL, *sizelimit = NULL;
  g_autoptr (GError) gerr = NULL;
  char *image, *overlay;
  int has_image, has_overlay;

  *spec = (struct mloop_server_spec) { 0 };
  *remote = NULL;
  if (!g_key_file_load_from_file (kf, path, G_KEY_FILE_NONE, &gerr)) {
    snprintf (err, errlen, "%s", gerr->message);
    errno = g_error_matches (gerr, G_FILE_ERROR, G_FILE_ERROR_NOENT)
      ? ENOENT : EINVAL;
    return -1;
  }
  switch (get_path (kf, "remote", remote)) {
  case 1:
    return 0;
  case -1:
    snprintf (err, errlen, "%s: its remote export's URI cannot be read",
              path);
    errno = EINVAL;
    return -1;
  }
  kind = g_key_file_get_string (kf, GROUP, "server", NULL);
  spec->kind = kind ? mloop_server_kind_find (kind, err, errlen) : NULL;
  has_image = get_path (kf, "image", &image);
  has_overlay = get_path (kf, "overlay", &overlay);
  spec->image = image;
  spec->overlay = overlay;
  offset = g_key_file_get_string (kf, GROUP, "offset", NULL);
  sizelimit = g_key_file_get_string (kf, GROUP, "sizelimit", NULL);
  spec->threads = (unsigned) g_key_file_get_integer (kf, GROUP, "threads",
                                                     NULL);
  spec->read_only = g_key_file_get_boolean (kf, GROUP, "read_only", NULL);
  spec->in_process = g_key_file_get_boolean (kf, GROUP, "in_process", NULL);
  spec->io_timeout = (unsigned) g_key_file_get_integer (kf, GROUP,
                                                        "io_timeout", NULL);
  /* An overlay there but unreadable is a broken record: left out, the
   * next server would serve the image without it.
   */
  if (spec->kind == NULL || has_image != 1 || has_overlay == -1 ||
      offset == NULL ||
      sizelimit == NULL ||
      !g_ascii_string_to_unsigned (offset, 10, 0, G_MAXUINT64,
                                   &spec->offset, NULL) ||
      !g_ascii_string_to_unsigned (sizelimit, 10, 0, G_MAXUINT64,
                                   &spec->sizelimit, NULL)) {
    snprintf (err, errlen, "%s: not a whole record of a kept device", path);
    g_free ((char *) spec->image);
    g_free ((char *) spec->overlay);
    *spec = (struct mloop_server_spec) { 0 };
    errno = EINVAL;
    return -1;
  }
  return 0;
}

void
keep_record_remove (const char *dir)
{
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_KEEP, NULL);

  g_unlink (path);
}
