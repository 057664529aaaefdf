/* A process that serves many images (mloopd serving inside itself)
 * checks for room in fs.aio-max-nr at every open.  Opening and destroying
 * a context for each check costs an RCU grace period per io_destroy
 * (30-40 ms under emulation, on the way of every attach), so only the
 * process's first check opens one, which also shows that io_setup works
 * here at all; later checks count the events the system has reserved.
 * Checked: a later check makes no io_setup (a seccomp filter that fails
 * io_setup with EPERM does not fail it), and still refuses when the
 * limit (MLOOP_TEST_AIO_MAX, the test stand-in for fs.aio-max-nr) has
 * no room for the smallest context.  Well under a second, unit suite.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#include "aio_ring.h"
#include "unit.h"

/* From here on, io_setup fails with EPERM, as in a sandbox that forbids
 * it.
 */
static void
forbid_io_setup (void)
{
  struct sock_filter filter[] = {
    BPF_STMT (BPF_LD | BPF_W | BPF_ABS, offsetof (struct seccomp_data, nr)),
    BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, SYS_io_setup, 0, 1),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {
    .len = sizeof filter / sizeof filter[0], .filter = filter,
  };

  if (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == -1 ||
      prctl (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == -1)
    unit_skip ("cannot install a seccomp filter: %s", strerror (errno));
}

int
main (void)
{
  struct mloop_aio_ring ring;
  char err[512];
  int r;

  /* Room for exactly one context of the floor's depth. */
  setenv ("MLOOP_TEST_AIO_MAX", "8", 1);
  r = mloop_aio_check_room (err, sizeof err);
  CHECK (r == 0, "first check: %s", err);

  r = mloop_aio_ring_init (&ring, MLOOP_AIO_RING_FLOOR);
  CHECK (r == 0, "opening the one context there is room for: %s",
         strerror (-r));
  err[0] = '\0';
  r = mloop_aio_check_room (err, sizeof err);
  CHECK (r == -1 && strstr (err, "exhausted"),
         "with no room left the check gave %d (%s)", r, err);
  mloop_aio_ring_destroy (&ring);

  forbid_io_setup ();
  r = mloop_aio_check_room (err, sizeof err);
  CHECK (r == 0, "a later check opened a context: %s", err);
  return 0;
}
