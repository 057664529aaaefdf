/* mloop — whether a path only trusted users can redirect. */
#include <errno.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <glib.h>

#include "errmsg.h"
#include "trusted_path.h"

/* As the kernel's own limit on links followed in one lookup. */
#define MAX_LINKS 40

static bool
trusted_owner (const struct stat *st)
{
  return st->st_uid == 0 || st->st_uid == geteuid ();
}

/* Whether entries in directory ST can be renamed only by trusted users
 * or by their own entries' owners (sticky).
 */
static bool
closed_dir (const struct stat *st)
{
  return !(st->st_mode & (S_IWGRP | S_IWOTH)) || (st->st_mode & S_ISVTX);
}

/* Whether directory DIR is on /proc, whose links (self, cwd, fd/N) the
 * kernel follows to objects, not by their text.
 */
static bool
on_proc (const char *dir)
{
  struct statfs fs;

  return statfs (dir, &fs) == 0 && fs.f_type == PROC_SUPER_MAGIC;
}

bool
mloop_path_trusted (const char *path, char *why, size_t whylen)
{
  /* What is left to resolve, and where resolving has got to. */
  GQueue *left = g_queue_new ();
  g_autofree char *at = g_strdup ("/");
  unsigned links = 0;
  struct stat st;
  bool ok = false;

  if (!g_path_is_absolute (path)) {
    mloop_fail (why, whylen, "%s is not an absolute path", path);
    goto out;
  }
  {
    g_auto (GStrv) parts = g_strsplit (path, "/", -1);

    for (char **p = parts; *p; p++)
      if (**p)
        g_queue_push_tail (left, g_strdup (*p));
  }
  if (lstat (at, &st) == -1 || !trusted_owner (&st) || !closed_dir (&st)) {
    mloop_fail (why, whylen, "%s: / is not root's alone", path);
    goto out;
  }
  while (!g_queue_is_empty (left)) {
    g_autofree char *name = g_queue_pop_head (left);
    g_autofree char *next = NULL;

    if (strcmp (name, ".") == 0)
      continue;
    if (strcmp (name, "..") == 0) {
      char *up = g_path_get_dirname (at);

      g_free (at);
      at = up;
      continue;
    }
    next = g_build_filename (at, name, NULL);
    if (lstat (next, &st) == -1) {
      mloop_fail (why, whylen, "%s: %s: %s", path, next, strerror (errno));
      goto out;
    }
    if (!trusted_owner (&st)) {
      mloop_fail (why, whylen, "%s: %s belongs to uid %u, who could make "
                  "the path lead elsewhere", path, next,
                  (unsigned) st.st_uid);
      goto out;
    }
    if (S_ISLNK (st.st_mode) && on_proc (at)) {
      /* Its text is not where the kernel goes: /proc/self/cwd is
       * another directory in each process that opens the path.
       */
      mloop_fail (why, whylen, "%s: %s is a link of /proc's, which leads "
                  "elsewhere for each process", path, next);
      goto out;
    }
    if (S_ISLNK (st.st_mode)) {
      g_autofree char *target = g_file_read_link (next, NULL);
      g_auto (GStrv) parts = NULL;
      guint n;

      if (target == NULL || ++links > MAX_LINKS) {
        mloop_fail (why, whylen, "%s: %s: %s", path, next,
                    target ? "too many symbolic links" : strerror (errno));
        goto out;
      }
      /* The target's parts go first, from / when it is absolute. */
      parts = g_strsplit (target, "/", -1);
      n = g_strv_length (parts);
      for (guint i = n; i-- > 0; )
        if (*parts[i])
          g_queue_push_head (left, g_strdup (parts[i]));
      if (g_path_is_absolute (target)) {
        g_free (at);
        at = g_strdup ("/");
      }
      continue;
    }
    if (S_ISDIR (st.st_mode) && !closed_dir (&st)) {
      mloop_fail (why, whylen, "%s: %s may be written by other users and "
                  "is not sticky, so one could swap what the path leads to",
                  path, next);
      goto out;
    }
    g_free (at);
    at = g_steal_pointer (&next);
  }
  ok = true;
out:
  g_queue_free_full (left, g_free);
  return ok;
}
