/* mloop — what the threads that do a device's IO may do beyond the open
 * file they serve (io_rights.h).
 */
#include <stdatomic.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/capability.h>

#include "io_rights.h"
#include "memory_pressure.h"

/* The kernel's overflow user and group: nobody's. */
#define UNPRIVILEGED_ID 65534

static atomic_bool open_file_only;

void
mloop_io_rights_open_file_only (void)
{
  atomic_store (&open_file_only, true);
}

/* This thread's file system identity and capabilities, and only this
 * thread's: the kernel keeps them per thread, and glibc's setgroups
 * would change every thread's, so the system calls are made directly.
 * Best effort: a server without CAP_SETUID keeps fsuid 0 (ext4's
 * reserve then stays open to it), which only a sandbox stricter than
 * mloop-dbus's unit would cause.
 */
static void
drop_write_rights (void)
{
  struct __user_cap_header_struct header = {
    .version = _LINUX_CAPABILITY_VERSION_3,
  };
  struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

  syscall (SYS_setgroups, (size_t) 0, NULL);
  setfsgid (UNPRIVILEGED_ID);
  setfsuid (UNPRIVILEGED_ID);
  if (syscall (SYS_capget, &header, data) == 0) {
    data[CAP_TO_INDEX (CAP_SYS_RESOURCE)].effective &=
      ~CAP_TO_MASK (CAP_SYS_RESOURCE);
    syscall (SYS_capset, &header, data);
  }
}

bool
mloop_io_thread (void)
{
  static __thread bool prepared;
  /* First: PR_SET_IO_FLUSHER needs CAP_SYS_RESOURCE. */
  bool flusher = mloop_io_flusher_thread ();

  if (!prepared) {
    prepared = true;
    if (atomic_load (&open_file_only))
      drop_write_rights ();
  }
  return flusher;
}
