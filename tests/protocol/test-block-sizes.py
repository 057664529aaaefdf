#!/usr/bin/python3
"""The advertised block sizes are what the server serves: minimum 1, so a
strict client (libnbd's default, which refuses requests off the minimum
before sending them) may read and write single bytes anywhere; preferred
the O_DIRECT alignment, a power of two of at least 512.  And a READ
flagged DF (one chunk), offered only with structured replies, is served.
Cost: under a second per server."""
import nbd

import harness

SIZE = 1 << 20
data = harness.pattern(SIZE, 7)
image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect()               # strict

minimum = h.get_block_size(nbd.SIZE_MINIMUM)
preferred = h.get_block_size(nbd.SIZE_PREFERRED)
assert minimum == 1, f"minimum block size {minimum}, expected 1"
assert preferred >= 512 and preferred & (preferred - 1) == 0, \
    f"preferred block size {preferred} is not a power of two from 512"

mirror = bytearray(data)
assert h.pread(3, 16) == data[16:19], "3 bytes at offset 16"
assert h.pread(1, SIZE - 1) == data[SIZE - 1:], "the last byte"
# Across a block boundary, and a single byte.
for off, new in ((4093, b"abcde"), (700001, b"z")):
    h.pwrite(new, off)
    mirror[off:off + len(new)] = new
h.flush()
assert h.pread(SIZE, 0) == bytes(mirror), "read back after unaligned writes"
assert h.can_df(), "DF not offered with structured replies"
chunks = []
buf = h.pread_structured(8192, 4096,
                         lambda sub, off, status, err: chunks.append(off),
                         nbd.CMD_FLAG_DF)
assert buf == bytes(mirror[4096:12288]) and chunks == [4096], \
    f"DF read: chunks at {chunks}"
h.shutdown()

plain = nbd.NBD()
plain.set_request_structured_replies(False)
plain.connect_uri(srv.uri)
assert not plain.can_df(), "DF offered without structured replies"
plain.shutdown()
srv.stop()
with open(image, "rb") as f:
    assert f.read() == bytes(mirror), "the file differs from what was written"
print(f"ok: minimum 1, preferred {preferred}; strict unaligned IO served")
