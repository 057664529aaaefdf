/* mloop — entries of the user and group databases, however large.  See
 * user_db.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

#include "user_db.h"

#define FIRST_GUESS 4096

/* One lookup by one key into one kind of entry: the *_r call, which
 * says whether it found one in *FOUND.
 */
struct lookup {
  uid_t uid;
  const char *name;
  struct passwd *pw;
  struct group *gr;
};

static int
look_up (const struct lookup *l, char *buf, size_t size, bool *found)
{
  struct passwd *pw_found = NULL;
  struct group *gr_found = NULL;
  int r;

  if (l->gr)
    r = getgrnam_r (l->name, l->gr, buf, size, &gr_found);
  else if (l->name)
    r = getpwnam_r (l->name, l->pw, buf, size, &pw_found);
  else
    r = getpwuid_r (l->uid, l->pw, buf, size, &pw_found);
  *found = pw_found != NULL || gr_found != NULL;
  return r;
}

static int
grow_and_look_up (const struct lookup *l, char **buf)
{
  size_t size = FIRST_GUESS;
  bool found = false;
  int r;

  for (;;) {
    char *more = realloc (*buf, size);

    if (more == NULL) {
      errno = ENOMEM;
      return -1;
    }
    *buf = more;
    r = look_up (l, *buf, size, &found);
    if (r != ERANGE || size >= MLOOP_USER_DB_ENTRY_MAX)
      break;
    size *= 2;
  }
  if (r != 0) {
    errno = r;
    return -1;
  }
  if (!found) {
    errno = ENOENT;
    return -1;
  }
  return 0;
}

int
mloop_user_by_uid (uid_t uid, struct passwd *pw, char **buf)
{
  const struct lookup l = { .uid = uid, .pw = pw };

  return grow_and_look_up (&l, buf);
}

int
mloop_user_by_name (const char *name, struct passwd *pw, char **buf)
{
  const struct lookup l = { .name = name, .pw = pw };

  return grow_and_look_up (&l, buf);
}

int
mloop_group_by_name (const char *name, struct group *gr, char **buf)
{
  const struct lookup l = { .name = name, .gr = gr };

  return grow_and_look_up (&l, buf);
}
