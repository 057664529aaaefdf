#!/usr/bin/python3
"""A TRIM and a WRITE_ZEROES of more than 2 GiB in one request (an NBD
request's length is 32 bits, so up to 4 GiB - 1): each succeeds, its
range reads back as zeroes and the data beside it is untouched.  An RBD
image's librbd takes at most 2 GiB - 1 bytes in one rbd_discard.
Cost: under a second per server."""
import harness

MiB, GiB = 1 << 20, 1 << 30
SIZE = 4 * GiB
LARGE = 3 * GiB + 4097          # over INT_MAX, not a multiple of anything
DATA = [(0, MiB), (2 * GiB + 5 * MiB, MiB), (SIZE - MiB, MiB)]

image = harness.make_patterned_image(SIZE, DATA)
srv = harness.Server(image)
h = srv.connect(strict=False)
model = {off: bytearray(harness.pattern(n, off)) for off, n in DATA}


def zeroed(what, start):
    """Zeroes [START, START + LARGE) in the model, then reads each data
    region back against it."""
    for off, n in DATA:
        lo, hi = max(off, start), min(off + n, start + LARGE)
        if lo < hi:
            model[off][lo - off:hi - off] = bytes(hi - lo)
    for off, n in DATA:
        assert h.pread(n, off) == bytes(model[off]), \
            f"after the {what} of {LARGE} bytes at {start}: the region at {off} differs"


h.trim(LARGE, MiB // 2)
zeroed("trim", MiB // 2)
h.zero(LARGE, SIZE - MiB // 2 - LARGE)
zeroed("zero", SIZE - MiB // 2 - LARGE)
h.flush()
h.shutdown()
srv.stop()
print(f"ok: a trim and a zero of {LARGE} bytes, zeroes inside, data beside them intact")
