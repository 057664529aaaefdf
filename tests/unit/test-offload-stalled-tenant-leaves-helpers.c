/* A process that serves many images (mloopd serving inside itself)
 * shares one pool of helper threads among them, for trims, zeroes,
 * read-modify-writes and IO no AIO context had room for.  An image whose
 * disk stalls (dm-delay, a dying disk) blocks each helper running one of
 * its jobs for as long as the disk takes; it must never hold every
 * helper, nor queue its jobs in front of another image's, or every
 * image of the process stalls with it.  Checked: with 2 helpers (room
 * for 8) and 2 jobs at most per image, six blocked jobs of one image
 * (both helpers blocked on it first) leave another's job to run at
 * once, and never more than 2 of the blocked image's run at a time.
 * Under a second, unit suite.
 */
#include <poll.h>
#include <stdatomic.h>
#include <unistd.h>

#include "offload.h"
#include "unit.h"

#define STALLED_JOBS 6

static int gate[2];             /* a byte per stalled job lets it finish */
static atomic_int stalled_running, stalled_most;

static void
stalled_run (struct offload_job *job)
{
  int now = atomic_fetch_add (&stalled_running, 1) + 1;
  int most = atomic_load (&stalled_most);
  char c;

  while (now > most && !atomic_compare_exchange_weak (&stalled_most, &most,
                                                      now))
    ;
  if (read (gate[0], &c, 1) != 1)
    unit_fail (__FILE__, __LINE__, "read", "the gate closed");
  atomic_fetch_sub (&stalled_running, 1);
}

static void
quick_run (struct offload_job *job)
{
}

/* Waits up to MS for a job to come back to IN; the jobs back. */
static int
wait_back (struct offload_inbox *in, int ms)
{
  struct pollfd p = { .fd = in->efd, .events = POLLIN };
  int n = 0;

  if (poll (&p, 1, ms) != 1)
    return 0;
  for (struct offload_job *j = offload_inbox_take (in); j; j = j->next)
    n++;
  return n;
}

int
main (void)
{
  struct offload_tenant stalled = { 0 }, neighbour = { 0 };
  struct offload_inbox stalled_home, neighbour_home;
  struct offload_job jobs[STALLED_JOBS], quick = { 0 };
  struct offload *pool;
  int back = 0;

  unit_deadline (30);
  CHECK (pipe (gate) == 0, "pipe");
  CHECK (offload_inbox_init (&stalled_home) == 0, "inbox");
  CHECK (offload_inbox_init (&neighbour_home) == 0, "inbox");
  pool = offload_start_shared (2, 8, 2);
  CHECK (pool != NULL, "starting the helpers");

  for (int i = 0; i < STALLED_JOBS; i++) {
    jobs[i] = (struct offload_job) {
      .run = stalled_run, .home = &stalled_home, .tenant = &stalled,
    };
    offload_submit (pool, &jobs[i]);
  }
  /* Both helpers blocked before the neighbour asks. */
  while (atomic_load (&stalled_running) < 2)
    unit_sleep_ms (1);
  quick = (struct offload_job) {
    .run = quick_run, .home = &neighbour_home, .tenant = &neighbour,
  };
  offload_submit (pool, &quick);
  CHECK (wait_back (&neighbour_home, 5000) == 1,
         "the neighbour's job waited behind the stalled image's");
  CHECK (atomic_load (&stalled_most) <= 2,
         "the stalled image ran %d jobs at once, over its 2",
         atomic_load (&stalled_most));

  /* Let the stalled ones finish: every job comes back. */
  for (int i = 0; i < STALLED_JOBS; i++)
    CHECK (write (gate[1], "x", 1) == 1, "write");
  while (back < STALLED_JOBS) {
    int n = wait_back (&stalled_home, 5000);

    CHECK (n > 0, "only %d of %d stalled jobs came back", back,
           STALLED_JOBS);
    back += n;
  }
  CHECK (atomic_load (&stalled_most) == 2,
         "the stalled image ran %d jobs at once, not its 2",
         atomic_load (&stalled_most));
  offload_stop (pool);
  offload_inbox_destroy (&stalled_home);
  offload_inbox_destroy (&neighbour_home);
  return 0;
}
