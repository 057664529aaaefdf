/* A unit test's say in fsync(2) and fdatasync(2) (sync_hook.h). */
#include <unistd.h>

#include "sync_hook.h"

int (*unit_sync_hook) (int fd, long call);

int
unit_sync_really (int fd, long call)
{
  return (int) syscall (call, fd);
}

static int
sync_through_hook (int fd, long call)
{
  return unit_sync_hook ? unit_sync_hook (fd, call)
    : unit_sync_really (fd, call);
}

int
fsync (int fd)
{
  return sync_through_hook (fd, SYS_fsync);
}

int
fdatasync (int fd)
{
  return sync_through_hook (fd, SYS_fdatasync);
}
