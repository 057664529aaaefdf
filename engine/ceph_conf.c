/* mloop — where librados would find a Ceph configuration.  See
 * ceph_conf.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ceph_conf.h"

/* librados's own search for a configuration when none is named, in
 * Ceph's order (CEPH_CONF_FILE_DEFAULT; its "$data_dir/config" is
 * skipped for a client, as librados does, here and in $CEPH_CONF's
 * list): $CEPH_CONF's list where it is set, else these; the first that
 * can be opened is the one.
 */
#define CEPH_CONF_SEARCH "/etc/ceph/$cluster.conf,$home/.ceph/$cluster.conf," \
  "$cluster.conf"
#define CEPH_CLUSTER "ceph"

/* The characters of a variable's name, as librados reads one after a
 * '$' (or between "${" and "}").
 */
#define VAR_CHARS "abcdefghijklmnopqrstuvwxyz_"

/* ENTRY, a place of the search, as librados expands it there
 * (md_config_t::_expand_meta), for the variables the search's places
 * use (malloc'ed): a variable's name is the whole run of VAR_CHARS
 * after its '$', or what "${...}" encloses; $cluster is "ceph"; $home
 * is $HOME, which replaces all that precedes it, as librados has it;
 * a '$' that starts no name is itself.  NULL with *OTHER set for a
 * place naming another variable, or an unclosed "${" (its file cannot
 * be judged as librados would find it), or out of memory.
 */
static char *
expand_search_entry (const char *entry, bool *other)
{
  const char *home = getenv ("HOME");
  size_t room = strlen (entry) + 1;
  char *out, *p;

  *other = false;
  for (const char *c = strchr (entry, '$'); c; c = strchr (c + 1, '$'))
    room += (home ? strlen (home) : 0) + sizeof CEPH_CLUSTER;
  if ((out = malloc (room)) == NULL)
    return NULL;
  p = out;
  while (*entry) {
    const bool braced = entry[0] == '$' && entry[1] == '{';
    const char *name = entry + (braced ? 2 : 1);
    const size_t len = strspn (name, VAR_CHARS);

    if (*entry != '$') {
      *p++ = *entry++;
      continue;
    }
    if (braced && name[len] != '}') {
      free (out);
      *other = true;
      return NULL;
    }
    if (len == 0)
      *p++ = '$';
    else if (len == 7 && strncmp (name, "cluster", 7) == 0)
      p = stpcpy (p, CEPH_CLUSTER);
    else if (len == 4 && strncmp (name, "home", 4) == 0)
      p = stpcpy (out, home ? home : "");
    else {
      free (out);
      *other = true;
      return NULL;
    }
    entry = name + len + (braced ? 1 : 0);
  }
  *p = '\0';
  return out;
}

/* PATH, one place of the search: a descriptor of what librados would
 * read there, or -ENOENT to go on to the next place.  librados goes on
 * past a place it cannot open, and past a directory; so does this.
 * Anything else is the one, trusted or not, a FIFO or a device too,
 * which librados reads as the configuration and looks no further: the
 * next place would be another configuration than librados's.  Such a
 * file is only looked at (O_PATH), never opened: the caller refuses
 * what is no regular file, and root opening a FIFO, a watchdog or a
 * tape a user linked into the search would wake its writer, start the
 * watchdog, rewind the tape.  A regular file is opened to be read
 * through that very look, so it is the file looked at; without /proc,
 * where it cannot be, the look is what is given.
 */
static int
open_place (const char *path)
{
  char through[64];
  struct stat sb;
  int seen = open (path, O_PATH | O_CLOEXEC), fd;

  if (seen < 0)
    return -ENOENT;
  if (fstat (seen, &sb) < 0 || S_ISDIR (sb.st_mode)) {
    close (seen);
    return -ENOENT;
  }
  if (!S_ISREG (sb.st_mode))
    return seen;
  snprintf (through, sizeof through, "/proc/self/fd/%d", seen);
  fd = open (through, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  /* No /proc (a chroot, a small container): not the name again, which
   * would open whatever stands there by then, a FIFO or a device
   * swapped in since the look, before it could be compared.  The look
   * itself, unless this process may not read the file it looked at
   * (asked of the descriptor, not the name).  Else an unreadable place
   * is passed over, as librados passes it.
   */
  if (fd < 0 && errno == ENOENT) {
    if (faccessat (seen, "", R_OK, AT_EACCESS | AT_EMPTY_PATH) == 0 ||
        errno != EACCES)
      return seen;
  }
  close (seen);
  return fd >= 0 ? fd : -ENOENT;
}


int
mloop_ceph_conf_open_searched (char **found)
{
  const char *list = getenv ("CEPH_CONF");
  char *places = strdup (list ? list : CEPH_CONF_SEARCH), *save = NULL;
  int fd = -ENOENT;

  *found = NULL;
  if (places == NULL)
    return -ENOMEM;
  for (char *entry = strtok_r (places, ";,", &save); entry && fd == -ENOENT;
       entry = strtok_r (NULL, ";,", &save)) {
    bool other;
    char *path;

    /* A client has no data directory: librados drops such a place. */
    if (strstr (entry, "$data_dir"))
      continue;
    path = expand_search_entry (entry, &other);
    if (path == NULL) {
      fd = other ? -ENOTSUP : -ENOMEM;
      if (other)
        *found = strdup (entry);
      break;
    }
    fd = open_place (path);
    if (fd < 0)
      free (path);
    else
      *found = path;
  }
  free (places);
  return fd;
}

char *
mloop_ceph_cluster_name (const char *conf)
{
  const char *base;
  size_t len;

  if (conf == NULL)
    return strdup (CEPH_CLUSTER);
  base = strrchr (conf, '/');
  base = base ? base + 1 : conf;
  len = strlen (base);
  /* ".conf" alone is a hidden file's name, with no extension. */
  if (len <= strlen (".conf") ||
      strcmp (base + len - strlen (".conf"), ".conf") != 0)
    return strdup (CEPH_CLUSTER);
  return strndup (base, len - strlen (".conf"));
}
