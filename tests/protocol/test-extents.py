#!/usr/bin/python3
"""BLOCK_STATUS matches the image's own map (a file's SEEK_DATA/SEEK_HOLE,
an RBD image's allocation) and never reports a hole where data is."""
import nbd
import harness

SIZE = 64 << 20
REGIONS = [(0, 1 << 20), (10 << 20, 3 << 20), (40 << 20, 64 << 10), (SIZE - (1 << 20), 1 << 20)]
image = harness.make_patterned_image(SIZE, REGIONS)


srv = harness.Server(image)
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(srv.uri)
harness.on_exit(lambda: harness._disconnect(h))
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)

served = []
pos = 0
while pos < SIZE:
    got = []

    def cb(metacontext, offset, entries, err):
        got.extend(entries)
    h.block_status(min(SIZE - pos, 32 << 20), pos, cb)
    for i in range(0, len(got), 2):
        length, flags = got[i], got[i + 1]
        if not flags & nbd.STATE_HOLE:
            if served and served[-1][1] == pos:
                served[-1] = (served[-1][0], pos + length)
            else:
                served.append((pos, pos + length))
        pos += length

expected = harness.image_data_ranges(image, 0, SIZE)
assert served == expected, f"served map {served} != the image's map {expected}"
for off, n in REGIONS:
    assert any(a <= off and off + n <= b for a, b in served), f"data at {off} reported as hole"
h.shutdown()
srv.stop()
print(f"ok: {len(served)} data extents, identical to the image's own map")
