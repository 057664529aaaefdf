/* A discard held between its two looks at the overlay.
 *
 * `mloop overlay discard` reads the overlay's header, then takes the
 * state lock and opens the overlay again by its path to lock and remove
 * it (device/overlay_file.c): what the path names may change in
 * between.  The tests that it then removes or opens nothing but what
 * it checked make that window certain, not raced for: holding the state
 * lock, they start the discard in a child, wait (inotify) until it has
 * read the header and closed it, put something else at the path and
 * only then let the discard go on.
 */
#ifndef MLOOP_TESTS_HELD_DISCARD_H
#define MLOOP_TESTS_HELD_DISCARD_H

#include <sys/types.h>

struct held_discard {
  pid_t pid;
  int lock;
};

/* Takes the state lock, forks a child that runs RUN (PATH) and exits
 * with what it returns, and returns once the child has closed the
 * overlay at PATH, read only (its header): it then waits for the lock.
 * Skips the test where inotify is missing.
 */
void held_discard_start (struct held_discard *h, const char *path,
                         int (*run) (const char *path));

/* Lets the child go on past the state lock; returns its wait status. */
int held_discard_finish (struct held_discard *h);

/* A RUN for held_discard_start: the discard of PATH, saying on stderr
 * why it refused; 1 if it refused, 0 if it removed PATH.
 */
int held_discard_run (const char *path);

#endif
