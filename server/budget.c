/* mloop-server — request buffer budgets.  See budget.h for the rules. */
#include "align.h"
#include "budget.h"

void
budget_init (struct budget *b, uint64_t limit, uint64_t conn_limit)
{
  atomic_init (&b->held, 0);
  b->limit = limit;
  b->conn_limit = conn_limit;
}

bool
budget_may_take (struct budget *b, uint64_t conn_held, uint64_t n)
{
  if (conn_held == 0 && n <= MLOOP_KEEP_BUFFER)
    return true;
  if (conn_held > 0 && conn_held + n > b->conn_limit)
    return false;
  /* Checked, then charged by the caller: workers race here, so the
   * server may go over by what the others take between the two, at most
   * one request per worker.
   */
  return atomic_load_explicit (&b->held, memory_order_relaxed) + n
    <= b->limit;
}

bool
budget_may_keep (struct budget *b)
{
  return atomic_load_explicit (&b->held, memory_order_relaxed) <= b->limit / 2;
}

void
budget_charge (struct budget *b, uint64_t n)
{
  atomic_fetch_add_explicit (&b->held, n, memory_order_relaxed);
}

void
budget_release (struct budget *b, uint64_t n)
{
  atomic_fetch_sub_explicit (&b->held, n, memory_order_relaxed);
}
