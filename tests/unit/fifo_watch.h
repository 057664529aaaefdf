/* A FIFO whose every open is seen, for the tests that a path checked
 * to be a regular file is never opened once something else stands
 * there.  Opening is itself an act for a FIFO (it releases whoever
 * waits for a peer) as for a device node (a watchdog started, a tape
 * rewound), and a FIFO needs no root to make: the tests give one where
 * a regular file was checked and ask inotify whether it was opened.
 */
#ifndef MLOOP_TESTS_FIFO_WATCH_H
#define MLOOP_TESTS_FIFO_WATCH_H

#include <stdbool.h>

/* Makes a FIFO at PATH and returns an inotify descriptor (non-blocking)
 * watching it for IN_OPEN; the watch follows the FIFO's inode wherever
 * it is renamed.  Skips the test where FIFOs or inotify are missing.
 */
int fifo_watch (const char *path);

/* Whether the FIFO watched by IN was opened since last asked. */
bool fifo_watch_opened (int in);

#endif
