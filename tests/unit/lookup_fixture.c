/* What the lookup unit tests share (lookup_fixture.h). */
#include <glib.h>

#include "attach.h"
#include "device_state.h"
#include "lookup_fixture.h"
#include "server_kind.h"
#include "unit.h"

char *
unit_make_device (int index, const char *file, const struct stat *st,
                  uid_t owner, bool held, bool read_only)
{
  struct mloop_device_state s = {
    .index = index, .file = (char *) file, .size = 1 << 20,
    .file_dev = st->st_dev, .file_ino = st->st_ino,
    .held_image = held, .label = held ? (char *) "/home/user/mine.img"
    : NULL, .owner = owner, .person = owner, .read_only = read_only,
    .block_size = 512, .connections = 1, .threads = 1,
    .server = mloop_server_kind_default (),
  };
  char err[256];

  CHECK (mloop_state_create (&s, err, sizeof err) == 0, "create: %s", err);
  CHECK (mloop_state_save (&s, err, sizeof err) == 0, "save: %s", err);
  return s.dir;
}

void
unit_expect_lookup (const char *what, int index)
{
  struct mloop_device_state st;
  char err[512];

  CHECK (mloop_lookup (what, &st, err, sizeof err) == 0,
         "%s: %s", what, err);
  CHECK (st.index == index, "%s: found nbd%d (owner %u), expected nbd%d",
         what, st.index, (unsigned) st.owner, index);
  mloop_state_clear (&st);
}
