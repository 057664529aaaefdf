/* mloop — what is attached: one directory per device in the runtime dir. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib.h>
#include <glib/gstdio.h>

#include "errmsg.h"
#include "device_state.h"

#define GROUP "device"
#define LOCK_FILE ".lock"
#define DIR_PREFIX "dev-"

const char *
mloop_runtime_dir (void)
{
  static char *absolute;
  const char *env = g_getenv ("MLOOP_RUNTIME_DIR");

  if (!env || !*env)
    return "/run/mloop";
  if (env[0] == '/')
    return env;
  /* A relative one, made absolute once: servers run in /. */
  if (g_once_init_enter (&absolute))
    g_once_init_leave (&absolute, g_canonicalize_filename (env, NULL));
  return absolute;
}

int
mloop_runtime_dir_create (char *err, size_t errlen)
{
  const char *dir = mloop_runtime_dir ();
  struct stat st;

  if (g_mkdir_with_parents (dir, 0700) == -1)
    return mloop_fail (err, errlen, "cannot create %s: %s", dir, strerror (errno));
  /* Sockets in here reach the image: nobody else may even look. */
  if (stat (dir, &st) == -1 || (st.st_mode & 077) != 0)
    if (chmod (dir, 0700) == -1)
      return mloop_fail (err, errlen, "cannot make %s private: %s", dir,
                   strerror (errno));
  return 0;
}

int
mloop_state_lock (char *err, size_t errlen)
{
  g_autofree char *path = NULL;
  int fd;

  if (mloop_runtime_dir_create (err, errlen) == -1)
    return -1;
  path = g_build_filename (mloop_runtime_dir (), LOCK_FILE, NULL);
  fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd == -1 || flock (fd, LOCK_EX) == -1) {
    mloop_fail (err, errlen, "cannot lock %s: %s", path, strerror (errno));
    if (fd != -1)
      close (fd);
    return -1;
  }
  return fd;
}

int
mloop_state_lock_device (const char *dir, bool wait)
{
  int fd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

  if (fd != -1 && flock (fd, LOCK_EX | (wait ? 0 : LOCK_NB)) == -1) {
    int saved = errno;

    close (fd);
    errno = saved;
    fd = -1;
  }
  return fd;
}

/* Index INDEX's claim file: in the runtime directory itself, for as
 * long as an attach holds it (mloop_state_release_claim removes it).
 */
static char *
claim_path (int index)
{
  g_autofree char *name = g_strdup_printf (".claim-nbd%d", index);

  return g_build_filename (mloop_runtime_dir (), name, NULL);
}

int
mloop_state_claim_index (int index)
{
  g_autofree char *path = claim_path (index);
  char why[256];

  if (mloop_runtime_dir_create (why, sizeof why) == -1)
    return -1;
  /* A file its holder removed after this open is no claim: the next
   * attach makes a new one.  So a claim is a lock on the file the path
   * still names.
   */
  for (unsigned tries = 0; tries < 8; tries++) {
    struct stat held, named;
    int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    int saved;

    if (fd == -1)
      return -1;
    if (flock (fd, LOCK_EX | LOCK_NB) == -1) {
      saved = errno;
      close (fd);
      errno = saved;
      return -1;
    }
    if (fstat (fd, &held) == 0 && stat (path, &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino)
      return fd;
    close (fd);
  }
  errno = EWOULDBLOCK;
  return -1;
}

void
mloop_state_release_claim (int index, int fd)
{
  g_autofree char *path = NULL;

  if (fd < 0)
    return;
  path = claim_path (index);
  unlink (path);                /* still ours: we hold its lock */
  close (fd);
}

void
mloop_state_unlock (int fd)
{
  if (fd >= 0)
    close (fd);                 /* releases the flock */
}

char *
mloop_state_path (const struct mloop_device_state *s, const char *name)
{
  return g_build_filename (s->dir, name, NULL);
}

/* What the state file and `mloop list` say of a device on a remote
 * export, in place of a server kind.
 */
#define REMOTE "remote"

#define UBLK "ublk"

const char *
mloop_state_server_name (const struct mloop_device_state *s)
{
  if (s->transport == MLOOP_TRANSPORT_UBLK)
    return UBLK;
  return s->remote ? REMOTE : s->server->name;
}

const char *
mloop_state_transport_name (const struct mloop_device_state *s)
{
  return s->transport == MLOOP_TRANSPORT_UBLK ? UBLK : "nbd";
}

char *
mloop_state_device_name (const struct mloop_device_state *s)
{
  return g_strdup_printf (s->transport == MLOOP_TRANSPORT_UBLK ? "ublkb%d"
                          : "nbd%d", s->index);
}

const char *
mloop_state_image_name (const struct mloop_device_state *s)
{
  return s->held_image && s->label ? s->label : s->file;
}

/* A block device by its device number: the node it was attached by is
 * one of many (/dev/loop0, a container's own, one made with mknod in any
 * directory), each its own inode.  Anything else by device and inode.
 * A state that records no device number compares the node.
 */
bool
mloop_state_image_is (const struct mloop_device_state *s,
                      const struct stat *st)
{
  if (s->remote)
    return false;
  if (S_ISBLK (st->st_mode) && s->file_rdev != 0)
    return s->file_rdev == (uint64_t) st->st_rdev;
  return s->file_dev == (uint64_t) st->st_dev &&
    s->file_ino == (uint64_t) st->st_ino;
}

char *
mloop_state_held_token (void)
{
  g_autofree char *uuid = g_uuid_string_random ();

  return g_strconcat ("held:", uuid, NULL);
}

/* The kernel shows the identifier in a page with its newline: a name
 * near PATH_MAX with its token would be cut, and never match again, so
 * such a name gives way to the token alone.
 */
#define BACKEND_MAX 4000

char *
mloop_state_new_backend (const char *file)
{
  g_autofree char *token = g_strdup_printf ("%08x%08x", g_random_int (),
                                            g_random_int ());

  /* A held image's FILE is a token of its own already. */
  if (g_str_has_prefix (file, "held:"))
    return g_strdup (file);
  if (strlen (file) + 1 + strlen (token) > BACKEND_MAX)
    return g_strconcat ("mloop#", token, NULL);
  return g_strconcat (file, "#", token, NULL);
}

const char *
mloop_state_backend (const struct mloop_device_state *s)
{
  return s->backend ? s->backend : s->file;
}

char *
mloop_state_device_path (const struct mloop_device_state *s)
{
  g_autofree char *name = mloop_state_device_name (s);

  return g_strconcat ("/dev/", name, NULL);
}

int
mloop_state_create (struct mloop_device_state *s, char *err, size_t errlen)
{
  char *tmpl;

  if (mloop_runtime_dir_create (err, errlen) == -1)
    return -1;
  tmpl = g_build_filename (mloop_runtime_dir (), DIR_PREFIX "XXXXXX", NULL);
  if (g_mkdtemp_full (tmpl, 0700) == NULL) {
    mloop_fail (err, errlen, "cannot create a directory in %s: %s",
          mloop_runtime_dir (), strerror (errno));
    g_free (tmpl);
    return -1;
  }
  s->dir = tmpl;
  return 0;
}

/* Writes KF to PATH through a temporary and a rename: readers see all or
 * nothing.
 */
static int
write_key_file (GKeyFile *kf, const char *path, char *err, size_t errlen)
{
  g_autoptr (GError) gerr = NULL;
  g_autofree char *data = NULL;
  gsize len;

  data = g_key_file_to_data (kf, &len, NULL);
  if (!g_file_set_contents_full (path, data, len,
                                 G_FILE_SET_CONTENTS_CONSISTENT, 0600, &gerr))
    return mloop_fail (err, errlen, "cannot write %s: %s", path,
                       gerr->message);
  return 0;
}

/* Writes S's keys to its directory's file NAME. */
static int
save_as (const struct mloop_device_state *s, const char *name, char *err,
         size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *path = mloop_state_path (s, name);

  g_key_file_set_string (kf, GROUP, "transport",
                         mloop_state_transport_name (s));
  g_key_file_set_integer (kf, GROUP, "index", s->index);
  g_key_file_set_string (kf, GROUP, "file", s->file);
  if (s->backend)
    g_key_file_set_string (kf, GROUP, "backend", s->backend);
  g_key_file_set_uint64 (kf, GROUP, "file_dev", s->file_dev);
  g_key_file_set_uint64 (kf, GROUP, "file_ino", s->file_ino);
  if (s->file_rdev)
    g_key_file_set_uint64 (kf, GROUP, "file_rdev", s->file_rdev);
  g_key_file_set_boolean (kf, GROUP, "held_image", s->held_image);
  if (s->label)
    g_key_file_set_string (kf, GROUP, "label", s->label);
  g_key_file_set_uint64 (kf, GROUP, "owner", s->owner);
  g_key_file_set_uint64 (kf, GROUP, "person", s->person);
  g_key_file_set_uint64 (kf, GROUP, "offset", s->offset);
  g_key_file_set_uint64 (kf, GROUP, "sizelimit", s->sizelimit);
  g_key_file_set_uint64 (kf, GROUP, "size", s->size);
  if (s->overlay) {
    g_key_file_set_string (kf, GROUP, "overlay", s->overlay);
    g_key_file_set_boolean (kf, GROUP, "overlay_temporary",
                            s->overlay_temporary);
  }
  g_key_file_set_uint64 (kf, GROUP, "block_size", s->block_size);
  g_key_file_set_boolean (kf, GROUP, "read_only", s->read_only);
  g_key_file_set_uint64 (kf, GROUP, "connections", s->connections);
  g_key_file_set_uint64 (kf, GROUP, "threads", s->threads);
  g_key_file_set_string (kf, GROUP, "server", mloop_state_server_name (s));
  g_key_file_set_integer (kf, GROUP, "server_pid", s->server_pid);
  g_key_file_set_integer (kf, GROUP, "supervisor_pid", s->supervisor_pid);
  g_key_file_set_boolean (kf, GROUP, "service_kept", s->service_kept);
  g_key_file_set_boolean (kf, GROUP, "server_in_process",
                          s->server_in_process);
  g_key_file_set_uint64 (kf, GROUP, "timeout", s->timeout);
  g_key_file_set_uint64 (kf, GROUP, "dead_timeout", s->dead_timeout);
  g_key_file_set_uint64 (kf, GROUP, "export_flags", s->export_flags);
  g_key_file_set_boolean (kf, GROUP, "partscan", s->partscan);
  g_key_file_set_boolean (kf, GROUP, "autoclear", s->autoclear);
  return write_key_file (kf, path, err, errlen);
}

int
mloop_state_save (const struct mloop_device_state *s, char *err,
                  size_t errlen)
{
  return save_as (s, MLOOP_DIR_STATE, err, errlen);
}

int
mloop_state_save_claim (const struct mloop_device_state *s, char *err,
                        size_t errlen)
{
  return save_as (s, MLOOP_DIR_CLAIM, err, errlen);
}

#define SUPERVISOR_GROUP "supervisor"

int
mloop_state_save_supervisor (const char *dir,
                             const struct mloop_supervisor_record *r,
                             char *err, size_t errlen)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_SUPERVISOR, NULL);

  g_key_file_set_integer (kf, SUPERVISOR_GROUP, "server_pid", r->server_pid);
  g_key_file_set_uint64 (kf, SUPERVISOR_GROUP, "restarts", r->restarts);
  if (r->last_failure)
    g_key_file_set_string (kf, SUPERVISOR_GROUP, "last_failure",
                           r->last_failure);
  g_key_file_set_uint64 (kf, SUPERVISOR_GROUP, "reconnects", r->reconnects);
  if (r->last_reconnect)
    g_key_file_set_string (kf, SUPERVISOR_GROUP, "last_reconnect",
                           r->last_reconnect);
  g_key_file_set_uint64 (kf, SUPERVISOR_GROUP, "handovers", r->handovers);
  if (r->handover_error)
    g_key_file_set_string (kf, SUPERVISOR_GROUP, "handover_error",
                           r->handover_error);
  return write_key_file (kf, path, err, errlen);
}

static void
load_supervisor_record (const char *dir, struct mloop_device_state *s)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *path = g_build_filename (dir, MLOOP_DIR_SUPERVISOR, NULL);
  int pid;

  if (!g_key_file_load_from_file (kf, path, G_KEY_FILE_NONE, NULL))
    return;
  pid = g_key_file_get_integer (kf, SUPERVISOR_GROUP, "server_pid", NULL);
  if (pid > 0)
    s->server_pid = pid;
  s->restarts = g_key_file_get_uint64 (kf, SUPERVISOR_GROUP, "restarts",
                                       NULL);
  s->last_failure = g_key_file_get_string (kf, SUPERVISOR_GROUP,
                                           "last_failure", NULL);
  s->reconnects = g_key_file_get_uint64 (kf, SUPERVISOR_GROUP, "reconnects",
                                         NULL);
  s->last_reconnect = g_key_file_get_string (kf, SUPERVISOR_GROUP,
                                             "last_reconnect", NULL);
  s->handovers = g_key_file_get_uint64 (kf, SUPERVISOR_GROUP, "handovers",
                                        NULL);
  s->handover_error = g_key_file_get_string (kf, SUPERVISOR_GROUP,
                                             "handover_error", NULL);
}

/* Reads DIR's file NAME (state or claim) into S. */
static int
load_from (const char *dir, const char *name, struct mloop_device_state *s)
{
  g_autoptr (GKeyFile) kf = g_key_file_new ();
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autofree char *server = NULL;
  g_autofree char *transport = NULL;

  memset (s, 0, sizeof *s);
  if (!g_key_file_load_from_file (kf, path, G_KEY_FILE_NONE, NULL))
    return -1;
  s->dir = g_strdup (dir);
  /* A state written before ublk existed has no transport: nbd. */
  transport = g_key_file_get_string (kf, GROUP, "transport", NULL);
  if (transport && strcmp (transport, UBLK) == 0)
    s->transport = MLOOP_TRANSPORT_UBLK;
  s->index = g_key_file_get_integer (kf, GROUP, "index", NULL);
  s->file = g_key_file_get_string (kf, GROUP, "file", NULL);
  s->backend = g_key_file_get_string (kf, GROUP, "backend", NULL);
  s->file_dev = g_key_file_get_uint64 (kf, GROUP, "file_dev", NULL);
  s->file_ino = g_key_file_get_uint64 (kf, GROUP, "file_ino", NULL);
  s->file_rdev = g_key_file_get_uint64 (kf, GROUP, "file_rdev", NULL);
  s->held_image = g_key_file_get_boolean (kf, GROUP, "held_image", NULL);
  s->label = g_key_file_get_string (kf, GROUP, "label", NULL);
  s->owner = (uid_t) g_key_file_get_uint64 (kf, GROUP, "owner", NULL);
  s->person = g_key_file_has_key (kf, GROUP, "person", NULL)
    ? (uid_t) g_key_file_get_uint64 (kf, GROUP, "person", NULL) : s->owner;
  s->offset = g_key_file_get_uint64 (kf, GROUP, "offset", NULL);
  s->sizelimit = g_key_file_get_uint64 (kf, GROUP, "sizelimit", NULL);
  s->size = g_key_file_get_uint64 (kf, GROUP, "size", NULL);
  s->overlay = g_key_file_get_string (kf, GROUP, "overlay", NULL);
  s->overlay_temporary = g_key_file_get_boolean (kf, GROUP,
                                                 "overlay_temporary", NULL);
  s->block_size = g_key_file_get_uint64 (kf, GROUP, "block_size", NULL);
  s->read_only = g_key_file_get_boolean (kf, GROUP, "read_only", NULL);
  s->connections = g_key_file_get_uint64 (kf, GROUP, "connections", NULL);
  s->threads = g_key_file_get_uint64 (kf, GROUP, "threads", NULL);
  server = g_key_file_get_string (kf, GROUP, "server", NULL);
  s->remote = server && strcmp (server, REMOTE) == 0;
  if (!s->remote && s->transport == MLOOP_TRANSPORT_NBD &&
      (server == NULL ||
       !(s->server = mloop_server_kind_find (server, NULL, 0))))
    s->server = mloop_server_kind_default ();
  s->server_pid = g_key_file_get_integer (kf, GROUP, "server_pid", NULL);
  s->supervisor_pid = g_key_file_get_integer (kf, GROUP, "supervisor_pid",
                                              NULL);
  s->server_in_process = g_key_file_get_boolean (kf, GROUP,
                                                 "server_in_process", NULL);
  s->service_kept = g_key_file_get_boolean (kf, GROUP, "service_kept",
                                            NULL);
  s->timeout = g_key_file_get_uint64 (kf, GROUP, "timeout", NULL);
  s->dead_timeout = g_key_file_get_uint64 (kf, GROUP, "dead_timeout", NULL);
  /* A state written before there was one: the request timeout was. */
  if (s->dead_timeout == 0)
    s->dead_timeout = s->timeout;
  s->export_flags = (uint16_t) g_key_file_get_uint64 (kf, GROUP,
                                                      "export_flags", NULL);
  s->partscan = g_key_file_get_boolean (kf, GROUP, "partscan", NULL);
  s->autoclear = g_key_file_get_boolean (kf, GROUP, "autoclear", NULL);
  if (s->file == NULL) {
    mloop_state_clear (s);
    return -1;
  }
  return 0;
}

int
mloop_state_load_claim (const char *dir, struct mloop_device_state *s)
{
  return load_from (dir, MLOOP_DIR_CLAIM, s);
}

int
mloop_state_load (const char *dir, struct mloop_device_state *s)
{
  if (load_from (dir, MLOOP_DIR_STATE, s) == -1)
    return -1;
  load_supervisor_record (dir, s);
  return 0;
}

static int
by_index (const void *a, const void *b)
{
  const struct mloop_device_state *x = a, *y = b;

  if (x->transport != y->transport)
    return (x->transport > y->transport) - (x->transport < y->transport);
  return (x->index > y->index) - (x->index < y->index);
}

/* Calls FN on every dev-* directory of the runtime dir. */
static void
for_each_dir (void (*fn) (const char *dir, void *arg), void *arg)
{
  g_autoptr (GDir) d = g_dir_open (mloop_runtime_dir (), 0, NULL);
  const char *name;

  if (d == NULL)
    return;
  while ((name = g_dir_read_name (d)) != NULL) {
    g_autofree char *dir = NULL;

    if (!g_str_has_prefix (name, DIR_PREFIX))
      continue;
    dir = g_build_filename (mloop_runtime_dir (), name, NULL);
    fn (dir, arg);
  }
}

static void
collect_complete (const char *dir, void *arg)
{
  GArray *list = arg;
  struct mloop_device_state s;

  if (mloop_state_load (dir, &s) == 0)
    g_array_append_val (list, s);
}

struct mloop_device_state *
mloop_state_list (size_t *n)
{
  GArray *list = g_array_new (FALSE, TRUE, sizeof (struct mloop_device_state));

  for_each_dir (collect_complete, list);
  g_array_sort (list, by_index);
  *n = list->len;
  return (struct mloop_device_state *) g_array_free (list, FALSE);
}

bool
mloop_state_nbd_device_of (int index, const char *backend, uid_t owner)
{
  size_t n;
  struct mloop_device_state *list;
  bool owned = false;

  if (backend == NULL)
    return false;
  list = mloop_state_list (&n);
  for (size_t i = 0; i < n && !owned; i++)
    owned = list[i].transport == MLOOP_TRANSPORT_NBD &&
      list[i].index == index && list[i].owner == owner &&
      strcmp (mloop_state_backend (&list[i]), backend) == 0;
  mloop_state_free_list (list, n);
  return owned;
}

static void
collect_claim (const char *dir, void *arg)
{
  g_autofree char *state = g_build_filename (dir, MLOOP_DIR_STATE, NULL);
  struct mloop_device_state s;
  int lock;

  if (g_file_test (state, G_FILE_TEST_EXISTS) ||
      load_from (dir, MLOOP_DIR_CLAIM, &s) == -1)
    return;
  /* A claim nobody holds is an attach that died: it claims nothing. */
  lock = mloop_state_lock_device (dir, false);
  if (lock == -1 && errno == EWOULDBLOCK)
    g_array_append_val (arg, s);
  else
    mloop_state_clear (&s);
  mloop_state_unlock (lock);
}

struct mloop_device_state *
mloop_state_list_claims (size_t *n)
{
  GArray *list = g_array_new (FALSE, TRUE, sizeof (struct mloop_device_state));

  for_each_dir (collect_claim, list);
  *n = list->len;
  return (struct mloop_device_state *) g_array_free (list, FALSE);
}

static void
collect_incomplete (const char *dir, void *arg)
{
  g_autofree char *state = g_build_filename (dir, MLOOP_DIR_STATE, NULL);

  if (!g_file_test (state, G_FILE_TEST_EXISTS))
    g_ptr_array_add (arg, g_strdup (dir));
}

char **
mloop_state_list_incomplete (void)
{
  GPtrArray *dirs = g_ptr_array_new ();

  for_each_dir (collect_incomplete, dirs);
  g_ptr_array_add (dirs, NULL);
  return (char **) g_ptr_array_free (dirs, FALSE);
}

int
mloop_state_lock_abandoned (const char *dir)
{
  g_autofree char *state = g_build_filename (dir, MLOOP_DIR_STATE, NULL);
  int lock = mloop_state_lock_device (dir, false);

  if (lock != -1 && g_file_test (state, G_FILE_TEST_EXISTS)) {
    mloop_state_unlock (lock);
    errno = EEXIST;
    return -1;
  }
  return lock;
}

void
mloop_state_remove (const char *dir)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  const char *name;

  if (d == NULL)
    return;
  while ((name = g_dir_read_name (d)) != NULL) {
    g_autofree char *path = g_build_filename (dir, name, NULL);

    g_unlink (path);
  }
  g_rmdir (dir);
}

void
mloop_remove_temporary_overlay_dir (const char *overlay)
{
  g_autofree char *dir = g_path_get_dirname (overlay);

  g_rmdir (dir);
}

void
mloop_state_remove_temporary_overlay (const struct mloop_device_state *s)
{
  if (s->overlay == NULL || !s->overlay_temporary)
    return;
  g_unlink (s->overlay);
  mloop_remove_temporary_overlay_dir (s->overlay);
}

void
mloop_state_clear (struct mloop_device_state *s)
{
  g_free (s->dir);
  g_free (s->file);
  g_free (s->backend);
  g_free (s->label);
  g_free (s->overlay);
  g_free (s->last_failure);
  g_free (s->last_reconnect);
  g_free (s->handover_error);
  memset (s, 0, sizeof *s);
  s->index = -1;
}

void
mloop_state_free_list (struct mloop_device_state *list, size_t n)
{
  for (size_t i = 0; i < n; i++)
    mloop_state_clear (&list[i]);
  g_free (list);
}
