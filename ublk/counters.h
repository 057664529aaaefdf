/* The request counters (nbd/stats.h) of a device taken over with
 * --recover: the file the dead server kept is reused, not truncated. */
#ifndef MLOOP_UBLK_COUNTERS_H
#define MLOOP_UBLK_COUNTERS_H

#include "stats.h"

/* Maps PATH shared.  A file the dead server left (our size and magic)
 * keeps its totals — requests, bytes, errors, connections_total go on
 * counting across the takeover — but "connections" and "in_flight"
 * are zeroed: they were the dead server's, and the requests it had in
 * flight are reissued to us and counted again.  Anything else at PATH
 * (absent, another size, no magic) is created afresh, as
 * mloop_stats_create does.  NULL on error with errno set. */
struct mloop_stats *ublk_counters_reopen (const char *path);

#endif
