/* mloopd — what it keeps of a device, on disk (keep_record.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

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

int
keep_record_save (const char *dir, const struct mloop_server_spec *spec,
                  char *err, size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *offset = g_strdup_printf ("%" PRIu64, spec->offset);
  g_autofree char *sizelimit = g_strdup_printf ("%" PRIu64, spec->sizelimit);

  g_key_file_set_string (kf, GROUP, "server", spec->kind->name);
  g_key_file_set_string (kf, GROUP, "image", spec->image);
  if (spec->overlay)
    g_key_file_set_string (kf, GROUP, "overlay", spec->overlay);
  g_key_file_set_string (kf, GROUP, "offset", offset);
  g_key_file_set_string (kf, GROUP, "sizelimit", sizelimit);
  g_key_file_set_integer (kf, GROUP, "threads", (gint) spec->threads);
  g_key_file_set_boolean (kf, GROUP, "read_only", spec->read_only);
  g_key_file_set_integer (kf, GROUP, "io_timeout", (gint) spec->io_timeout);
  return save (kf, dir, err, errlen);
}

int
keep_record_save_remote (const char *dir, const char *uri, char *err,
                         size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();

  g_key_file_set_string (kf, GROUP, "remote", uri);
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

  *spec = (struct mloop_server_spec) { 0 };
  *remote = NULL;
  if (!g_key_file_load_from_file (kf, path, G_KEY_FILE_NONE, &gerr)) {
    snprintf (err, errlen, "%s", gerr->message);
    errno = g_error_matches (gerr, G_FILE_ERROR, G_FILE_ERROR_NOENT)
      ? ENOENT : EINVAL;
    return -1;
  }
  *remote = g_key_file_get_string (kf, GROUP, "remote", NULL);
  if (*remote)
    return 0;
  kind = g_key_file_get_string (kf, GROUP, "server", NULL);
  spec->kind = kind ? mloop_server_kind_find (kind, err, errlen) : NULL;
  spec->image = g_key_file_get_string (kf, GROUP, "image", NULL);
  spec->overlay = g_key_file_get_string (kf, GROUP, "overlay", NULL);
  offset = g_key_file_get_string (kf, GROUP, "offset", NULL);
  sizelimit = g_key_file_get_string (kf, GROUP, "sizelimit", NULL);
  spec->threads = (unsigned) g_key_file_get_integer (kf, GROUP, "threads",
                                                     NULL);
  spec->read_only = g_key_file_get_boolean (kf, GROUP, "read_only", NULL);
  spec->io_timeout = (unsigned) g_key_file_get_integer (kf, GROUP,
                                                        "io_timeout", NULL);
  if (spec->kind == NULL || spec->image == NULL || offset == NULL ||
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
