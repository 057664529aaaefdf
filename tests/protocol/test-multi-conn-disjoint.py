#!/usr/bin/python3
"""Four connections write disjoint regions concurrently (many requests
in flight on each), then every connection reads every region back."""
import harness

CONNS = 4
REGION = 8 << 20
CHUNK = 256 << 10
image = harness.make_image(CONNS * REGION)
srv = harness.Server(image, ["threads=4"])
handles = [srv.connect() for _ in range(CONNS)]
assert all(h.can_multi_conn() for h in handles)

expected = [harness.pattern(REGION, c) for c in range(CONNS)]
cookies = []
for off in range(0, REGION, CHUNK):          # interleave the connections
    for c, h in enumerate(handles):
        data = expected[c][off:off + CHUNK]
        cookies.append((h, h.aio_pwrite(data, c * REGION + off)))
for h, cookie in cookies:
    while not h.aio_command_completed(cookie):
        h.poll(-1)

for reader in handles:
    for c in range(CONNS):
        assert reader.pread(REGION, c * REGION) == expected[c], \
            f"region {c} read through another connection differs"
for h in handles:
    h.shutdown()
srv.stop()
print(f"ok: {CONNS} connections x {REGION >> 20} MiB written concurrently, cross-read")
