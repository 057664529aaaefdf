/* The user and group databases' entries are found however large: a
 * user whose GECOS field is longer than a first guess of a buffer, a
 * group with hundreds of members; one larger than the most an entry
 * may take is ERANGE, and one that is not there ENOENT, so a caller
 * tells "unknown" from "could not tell".
 * Root (it binds files of its own over /etc/passwd and /etc/group in a
 * mount namespace of its own): about 0.05 s, in the unit suite of every
 * tier; a SKIP without root or namespaces.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include <glib.h>

#include "unit.h"
#include "user_db.h"

#define WIDE_UID 64999
#define HUGE_UID 64998
#define WIDE_GECOS 6000
#define MEMBERS 400

/* TEXT into DIR/NAME, bound over /etc/TARGET for this process only. */
static void
bind_over_etc (const char *dir, const char *name, const GString *text,
               const char *target)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_autofree char *etc = g_build_filename ("/etc", target, NULL);

  CHECK (g_file_set_contents (path, text->str, (gssize) text->len, NULL),
         "cannot write %s", path);
  CHECK (mount (path, etc, "none", MS_BIND, NULL) == 0,
         "bind %s over %s: %s", path, etc, strerror (errno));
}

int
main (void)
{
  const char *dir;
  g_autoptr (GString) passwd = g_string_new (NULL);
  g_autoptr (GString) group = g_string_new (NULL);
  struct passwd pw;
  struct group gr;
  char *buf = NULL;

  unit_deadline (10);
  if (geteuid () != 0)
    unit_skip ("needs root, to bind over /etc/passwd and /etc/group");
  dir = unit_tmpdir ("/tmp");
  g_string_append (passwd, "root:x:0:0:root:/root:/bin/sh\n");
  g_string_append_printf (passwd, "mloop-wide:x:%d:%d:", WIDE_UID, WIDE_UID);
  for (int i = 0; i < WIDE_GECOS; i++)
    g_string_append_c (passwd, 'w');
  g_string_append (passwd, ":/nonexistent:/bin/false\n");
  g_string_append_printf (group, "mloop-crowd:x:%d:", WIDE_UID);
  for (int i = 0; i < MEMBERS; i++)
    g_string_append_printf (group, "%smloop-member-%d", i ? "," : "", i);
  g_string_append_c (group, '\n');

  if (unshare (CLONE_NEWNS) == -1)
    unit_skip ("unshare: %s", strerror (errno));
  CHECK (mount ("none", "/", "none", MS_REC | MS_PRIVATE, NULL) == 0,
         "mount --make-rprivate /: %s", strerror (errno));
  bind_over_etc (dir, "passwd", passwd, "passwd");
  bind_over_etc (dir, "group", group, "group");

  CHECK (mloop_user_by_uid (WIDE_UID, &pw, &buf) == 0,
         "uid %d, whose GECOS field has %d bytes: %s", WIDE_UID, WIDE_GECOS,
         strerror (errno));
  CHECK (strcmp (pw.pw_name, "mloop-wide") == 0 &&
         strlen (pw.pw_gecos) == WIDE_GECOS, "uid %d is %s", WIDE_UID,
         pw.pw_name);
  CHECK (mloop_user_by_name ("mloop-wide", &pw, &buf) == 0 &&
         pw.pw_uid == WIDE_UID, "mloop-wide by name: %s", strerror (errno));
  CHECK (mloop_group_by_name ("mloop-crowd", &gr, &buf) == 0,
         "a group of %d members: %s", MEMBERS, strerror (errno));
  CHECK (gr.gr_gid == WIDE_UID && gr.gr_mem[MEMBERS - 1] != NULL &&
         gr.gr_mem[MEMBERS] == NULL, "mloop-crowd has not %d members",
         MEMBERS);

  errno = 0;
  CHECK (mloop_user_by_name ("mloop-nobody-here", &pw, &buf) == -1 &&
         errno == ENOENT, "a user not there: errno %s, not ENOENT",
         strerror (errno));
  errno = 0;
  CHECK (mloop_group_by_name ("mloop-nobody-here", &gr, &buf) == -1 &&
         errno == ENOENT, "a group not there: errno %s, not ENOENT",
         strerror (errno));

  /* Behind an entry too large to read, nothing is known: glibc's files
   * module fails every lookup that reads past it, and so must we.
   */
  g_string_append_printf (passwd, "mloop-huge:x:%d:%d:", HUGE_UID, HUGE_UID);
  for (unsigned i = 0; i < MLOOP_USER_DB_ENTRY_MAX + 1; i++)
    g_string_append_c (passwd, 'h');
  g_string_append (passwd, ":/nonexistent:/bin/false\n");
  /* Bound over the first bind, the new mount would sit on DIR/passwd
   * itself (the path now leads there), which could then not be removed.
   */
  CHECK (umount2 ("/etc/passwd", 0) == 0, "umount /etc/passwd: %s",
         strerror (errno));
  bind_over_etc (dir, "passwd.huge", passwd, "passwd");
  errno = 0;
  CHECK (mloop_user_by_uid (HUGE_UID, &pw, &buf) == -1 && errno == ERANGE,
         "an entry over %u bytes: errno %s, not ERANGE",
         MLOOP_USER_DB_ENTRY_MAX, strerror (errno));
  errno = 0;
  CHECK (mloop_user_by_name ("mloop-nobody-here", &pw, &buf) == -1 &&
         errno == ERANGE, "a user looked for past an entry too large to "
         "read: errno %s, not ERANGE", strerror (errno));
  free (buf);
  printf ("ok: large entries are found, a too large one is ERANGE, a "
          "missing one ENOENT\n");
  return 0;
}
