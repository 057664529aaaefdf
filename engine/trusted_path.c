/* mloop — whether a path only trusted users can redirect.  See
 * trusted_path.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "trusted_path.h"

/* As the kernel's own limit on links followed in one lookup. */
#define MAX_LINKS 40

/* Writes the reason into WHY (if any) and returns false. */
static bool __attribute__((format (printf, 3, 4)))
untrusted (char *why, size_t whylen, const char *fmt, ...)
{
  va_list ap;

  if (why && whylen) {
    va_start (ap, fmt);
    vsnprintf (why, whylen, fmt, ap);
    va_end (ap);
  }
  return false;
}

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

/* The text of symbolic link PATH (malloc'ed), or NULL with errno. */
static char *
read_link (const char *path)
{
  for (size_t size = 256; ; size *= 2) {
    char *text = malloc (size);
    ssize_t n;
    int e;

    if (text == NULL)
      return NULL;
    n = readlink (path, text, size);
    if (n >= 0 && (size_t) n < size) {
      text[n] = '\0';
      return text;
    }
    e = errno;
    free (text);
    if (n < 0) {
      errno = e;
      return NULL;
    }
  }
}

/* DIR, an absolute path with no '/' at its end but "/" itself, made
 * its parent in place, as the kernel goes up from it ("/" stays).
 */
static void
go_up (char *dir)
{
  char *slash = strrchr (dir, '/');

  slash[slash == dir ? 1 : 0] = '\0';
}

bool
mloop_path_trusted (const char *path, char *why, size_t whylen)
{
  /* What is left to resolve (its parts from REST on), where resolving
   * has got to (a directory, reached through no link), and the entry
   * looked at there.
   */
  char *left = NULL, *at = NULL, *next = NULL;
  const char *rest;
  unsigned links = 0;
  struct stat st;
  bool ok = false;

  if (path[0] != '/')
    return untrusted (why, whylen, "%s is not an absolute path", path);
  if ((left = strdup (path)) == NULL || (at = strdup ("/")) == NULL) {
    untrusted (why, whylen, "%s: %s", path, strerror (ENOMEM));
    goto out;
  }
  if (lstat (at, &st) == -1 || !trusted_owner (&st) || !closed_dir (&st)) {
    untrusted (why, whylen, "%s: / is not root's alone", path);
    goto out;
  }
  rest = left;
  for (;;) {
    const char *part;
    size_t len;

    rest += strspn (rest, "/");
    if (*rest == '\0')
      break;
    part = rest;
    len = strcspn (part, "/");
    rest += len;
    if (len == 1 && part[0] == '.')
      continue;
    if (len == 2 && part[0] == '.' && part[1] == '.') {
      go_up (at);
      continue;
    }
    free (next);
    if (asprintf (&next, "%s/%.*s", strcmp (at, "/") == 0 ? "" : at,
                  (int) len, part) < 0) {
      next = NULL;
      untrusted (why, whylen, "%s: %s", path, strerror (ENOMEM));
      goto out;
    }
    if (lstat (next, &st) == -1) {
      untrusted (why, whylen, "%s: %s: %s", path, next, strerror (errno));
      goto out;
    }
    if (!trusted_owner (&st)) {
      untrusted (why, whylen, "%s: %s belongs to uid %u, who could make "
                 "the path lead elsewhere", path, next,
                 (unsigned) st.st_uid);
      goto out;
    }
    if (S_ISLNK (st.st_mode) && on_proc (at)) {
      /* Its text is not where the kernel goes: /proc/self/cwd is
       * another directory in each process that opens the path.
       */
      untrusted (why, whylen, "%s: %s is a link of /proc's, which leads "
                 "elsewhere for each process", path, next);
      goto out;
    }
    if (on_proc (at)) {
      /* Nor any other entry there: /proc/PID/environ is root's while
       * PID is a root process, and the next process with that pid
       * writes it.
       */
      untrusted (why, whylen, "%s: %s is on /proc, whose entries are "
                 "another process's from one moment to the next", path,
                 next);
      goto out;
    }
    if (S_ISLNK (st.st_mode)) {
      char *target = read_link (next), *joined;

      if (target == NULL || ++links > MAX_LINKS) {
        untrusted (why, whylen, "%s: %s: %s", path, next,
                   target ? "too many symbolic links" : strerror (errno));
        free (target);
        goto out;
      }
      /* The target's parts go first, from / when it is absolute. */
      if (asprintf (&joined, "%s%s", target, rest) < 0) {
        free (target);
        untrusted (why, whylen, "%s: %s", path, strerror (ENOMEM));
        goto out;
      }
      if (target[0] == '/')
        strcpy (at, "/");
      free (target);
      free (left);
      left = joined;
      rest = left;
      continue;
    }
    if (S_ISDIR (st.st_mode) && !closed_dir (&st)) {
      untrusted (why, whylen, "%s: %s may be written by other users and "
                 "is not sticky, so one could swap what the path leads to",
                 path, next);
      goto out;
    }
    free (at);
    at = next;
    next = NULL;
  }
  ok = true;
out:
  free (next);
  free (left);
  free (at);
  return ok;
}
