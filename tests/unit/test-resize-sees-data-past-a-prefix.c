/* `mloop resize --size` refuses to cut off data (device/resize.c): it
 * looks for the first byte stored past the new size.  A store's extents
 * reply may cover only a prefix of the range asked (the RBD store's
 * stops after 1 GiB, which NBD allows); the look must ask again from
 * where each reply ended, not take the first reply's end for the
 * image's.  A stub store here answers at most PREFIX bytes a call, over
 * an image whose only data lies beyond the first reply.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine.h"
#include "resize.h"
#include "store.h"
#include "unit.h"

#define MiB ((uint64_t) 1 << 20)
#define SIZE (64 * MiB)
#define PREFIX (4 * MiB)
#define DATA_AT (40 * MiB)      /* one MiB of data there, holes elsewhere */
#define DATA_LEN MiB

static unsigned calls;

static uint64_t
stub_size (const struct mloop_store *s)
{
  return SIZE;
}

/* Reports [offset, offset + count) as it is, but never past PREFIX
 * bytes from OFFSET, in extents of one kind each.
 */
static int
stub_extents (struct mloop_store *s, uint64_t offset, uint64_t count,
              bool req_one, mloop_extent_fn fn, void *opaque)
{
  uint64_t end = offset + (count > PREFIX ? PREFIX : count);

  calls++;
  CHECK (offset + count <= SIZE, "asked past the end: %" PRIu64 "+%"
         PRIu64, offset, count);
  while (offset < end) {
    bool data = offset >= DATA_AT && offset < DATA_AT + DATA_LEN;
    uint64_t to = data ? DATA_AT + DATA_LEN : offset < DATA_AT ? DATA_AT
      : SIZE;
    int r;

    if (to > end)
      to = end;
    r = fn (opaque, offset, to - offset, !data);
    if (r < 0)
      return r;
    offset = to;
    if (req_one)
      break;
  }
  return 0;
}

static const struct mloop_store_ops stub_ops = {
  .kind = "stub",
  .extents = stub_extents,
  .size = stub_size,
};

int
main (void)
{
  struct mloop_store store = { .ops = &stub_ops };
  struct mloop_engine e = { .store = &store };
  uint64_t first = 0;
  int r;

  unit_deadline (10);
  r = mloop_first_data_past (&e, 8 * MiB, &first);
  CHECK (r == 0, "looking for data: %d", r);
  CHECK (first == DATA_AT, "the first byte of data past 8 MiB: %" PRIu64
         ", not %" PRIu64 " (%s)", first, (uint64_t) DATA_AT,
         first == SIZE ? "the data past the first reply was not seen, "
         "and a shrink would cut it off" : "wrong");
  CHECK (calls > 1, "asked %u times", calls);

  /* Past the data: none, after replies to the end. */
  calls = 0;
  r = mloop_first_data_past (&e, DATA_AT + DATA_LEN, &first);
  CHECK (r == 0 && first == SIZE, "past the data: %d, first %" PRIu64, r,
         first);
  CHECK (calls == (SIZE - DATA_AT - DATA_LEN + PREFIX - 1) / PREFIX,
         "asked %u times to the end", calls);
  return 0;
}
