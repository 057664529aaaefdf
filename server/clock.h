/* mloop-server — the one clock its deadlines and retry timers read. */
#ifndef MLOOP_SERVER_CLOCK_H
#define MLOOP_SERVER_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Milliseconds of CLOCK_MONOTONIC: immune to wall-clock changes. */
static inline int64_t
server_now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif /* MLOOP_SERVER_CLOCK_H */
