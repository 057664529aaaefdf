/* mloop-server — how many bytes of request buffers the server may hold.
 *
 * A READ's buffer lives from the moment its header is parsed until its
 * reply has been sent; a client that pipelines large READs and never
 * reads the replies would make the server hold all of them (40 reads of
 * 32 MiB grew it from 3 MiB to 1 GiB).  So buffers are charged to their
 * connection and to the server, and a connection whose next request does
 * not fit stops being read until replies drain (conn.c), exactly like
 * running out of request slots.
 *
 * The rules, in order (budget_may_take):
 *   1. a connection holding nothing may always take one request of up
 *      to MLOOP_KEEP_BUFFER (1 MiB), whatever the others hold: clients
 *      that read their replies are served even when stalled clients have
 *      used up the server's budget;
 *   2. otherwise the connection's bytes must stay within its limit — but
 *      a connection holding nothing may take one request of any size the
 *      server accepts;
 *   3. and the server's bytes within the server's limit.
 * So the server holds at most its limit plus 1 MiB per connection.
 * Buffers kept for reuse after a reply (at most BUDGET_KEEP_PER_CONN per
 * connection, each at most 1 MiB) stay charged to the server, and are
 * kept only while it has used less than half its limit (budget_may_keep),
 * so requests always have the other half.
 */
#ifndef MLOOP_SERVER_BUDGET_H
#define MLOOP_SERVER_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BUDGET_SERVER_DEFAULT  (1ull << 30)     /* --buffer-limit */
#define BUDGET_CONN_DEFAULT    (256ull << 20)   /* --connection-buffer-limit */
/* Small buffers a connection keeps for its next requests: a 1 MiB read,
 * or the 4 KiB buffers of 128 requests in flight.
 */
#define BUDGET_KEEP_PER_CONN   (1u << 20)

struct budget {
  atomic_uint_fast64_t held;    /* bytes charged, every connection */
  uint64_t limit;               /* the server's limit */
  uint64_t conn_limit;          /* each connection's limit */
};

void budget_init (struct budget *b, uint64_t limit, uint64_t conn_limit);

/* May a connection holding CONN_HELD bytes take N more?  Charges nothing. */
bool budget_may_take (struct budget *b, uint64_t conn_held, uint64_t n);

/* May a buffer that has served its request be kept (it stays charged)? */
bool budget_may_keep (struct budget *b);

void budget_charge (struct budget *b, uint64_t n);
void budget_release (struct budget *b, uint64_t n);

#endif /* MLOOP_SERVER_BUDGET_H */
