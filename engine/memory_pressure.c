/* mloop — keeping a local NBD server out of the memory-reclaim deadlock. */
#include <errno.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "memory_pressure.h"

#ifndef PR_SET_IO_FLUSHER
#define PR_SET_IO_FLUSHER 57
#endif

bool
mloop_io_flusher_thread (void)
{
  static __thread int state;    /* 0 unknown, 1 yes, -1 no */

  if (state == 0)
    state = prctl (PR_SET_IO_FLUSHER, 1, 0, 0, 0) == 0 ? 1 : -1;
  return state == 1;
}

int
mloop_lock_memory (void)
{
  return mlockall (MCL_CURRENT | MCL_FUTURE) == 0 ? 0 : -errno;
}
