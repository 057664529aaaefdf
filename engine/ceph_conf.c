/* mloop — where librados would find a Ceph configuration.  See
 * ceph_conf.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ceph_conf.h"

/* librados's own search for a configuration when none is named, in
 * Ceph's order (CEPH_CONF_FILE_DEFAULT; its "$data_dir/config" is
 * skipped for a client, as librados does): $CEPH_CONF's list where it
 * is set, else these; the first that can be opened is the one.
 */
#define CEPH_CONF_SEARCH "/etc/ceph/$cluster.conf,$home/.ceph/$cluster.conf," \
  "$cluster.conf"
#define CEPH_CLUSTER "ceph"

/* ENTRY, a place of the search, with the metavariables librados
 * expands there that the search's places use, $cluster and $home
 * (malloc'ed); NULL with *OTHER set for one that names another (its
 * file cannot be judged as librados would find it), or out of memory.
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
    if (*entry != '$')
      *p++ = *entry++;
    else if (strncmp (entry, "$cluster", 8) == 0) {
      p = stpcpy (p, CEPH_CLUSTER);
      entry += 8;
    }
    else if (strncmp (entry, "$home", 5) == 0) {
      p = stpcpy (p, home ? home : "");
      entry += 5;
    }
    else {
      free (out);
      *other = true;
      return NULL;
    }
  }
  *p = '\0';
  return out;
}

/* librados goes on past a place it cannot read; so does this, and past
 * one that is no regular file (a directory), which librados cannot read
 * either.  A regular file found is the one, trusted or not: the next
 * place would be another configuration than librados's.
 */
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
    char *path = expand_search_entry (entry, &other);
    struct stat sb;

    if (path == NULL) {
      fd = other ? -ENOTSUP : -ENOMEM;
      if (other)
        *found = strdup (entry);
      break;
    }
    fd = open (path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0 && (fstat (fd, &sb) < 0 || !S_ISREG (sb.st_mode))) {
      close (fd);
      fd = -1;
    }
    if (fd < 0) {
      fd = -ENOENT;
      free (path);
    }
    else
      *found = path;
  }
  free (places);
  return fd;
}
