/* mloop — a server's request counters, shared with `mloop status`.
 *
 * The server maps a small file (the device directory's "stats") and
 * bumps counters in it with relaxed atomics; readers map it read-only.
 * Nothing to ask and nothing to lock: a stuck server can still be
 * looked at, and the hot path pays one uncontended atomic add.
 */
#ifndef MLOOP_STATS_H
#define MLOOP_STATS_H

#include <stdint.h>

#define MLOOP_STATS_MAGIC UINT64_C(0x317473706f6f6c6d)  /* "mloop\6st1" */

enum mloop_stats_command {
  MLOOP_STATS_READ,
  MLOOP_STATS_WRITE,
  MLOOP_STATS_FLUSH,
  MLOOP_STATS_TRIM,
  MLOOP_STATS_ZERO,
  MLOOP_STATS_OTHER,            /* block status, cache, refused commands */
  MLOOP_STATS_NR_COMMANDS
};

struct mloop_stats {
  uint64_t magic;
  uint64_t connections;         /* open now */
  uint64_t connections_total;   /* ever accepted */
  uint64_t requests[MLOOP_STATS_NR_COMMANDS];
  uint64_t bytes_read, bytes_written;
  uint64_t errors;              /* replies with an error */
  uint64_t in_flight;
};

/* Creates (or truncates) PATH and maps it shared, zeroed.  NULL on error
 * with errno set.
 */
struct mloop_stats *mloop_stats_create (const char *path);
/* Maps PATH read-only, or NULL. */
const struct mloop_stats *mloop_stats_open (const char *path);
void mloop_stats_close (const struct mloop_stats *s);

const char *mloop_stats_command_name (enum mloop_stats_command c);

/* NULL-safe so a server without a stats file pays only a branch. */
#define MLOOP_STATS_ADD(s, field, n) \
  do { if (s) __atomic_fetch_add (&(s)->field, (n), __ATOMIC_RELAXED); } while (0)
#define MLOOP_STATS_SUB(s, field, n) \
  do { if (s) __atomic_fetch_sub (&(s)->field, (n), __ATOMIC_RELAXED); } while (0)

static inline uint64_t
mloop_stats_get (const uint64_t *counter)
{
  return __atomic_load_n (counter, __ATOMIC_RELAXED);
}

#endif /* MLOOP_STATS_H */
