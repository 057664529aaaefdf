#!/usr/bin/python3
"""Unaligned writes to disjoint bytes of the same sectors, from several
connections at once, lose nothing: the read-modify-write of a partial
block is safe against a concurrent writer to the same block."""
import harness

CONNS = 4
SECTORS = 64
image = harness.make_image(1 << 20)
srv = harness.Server(image)
handles = [srv.connect(strict=False) for _ in range(CONNS)]
expected = bytearray(SECTORS * 512)
cookies = []
# Connection c owns bytes b with b % CONNS == c of each sector, written
# 3 bytes at a time so every write is a partial-sector write.
for c, h in enumerate(handles):
    for s in range(SECTORS):
        for b in range(c * 3, 512, CONNS * 3):
            data = bytes([(s + b + c) % 251 + 1]) * min(3, 512 - b)
            off = s * 512 + b
            expected[off:off + len(data)] = data
            cookies.append((h, h.aio_pwrite(data, off)))
for h, cookie in cookies:
    while not h.aio_command_completed(cookie):
        h.poll(-1)
got = handles[0].pread(len(expected), 0)
assert got == bytes(expected), "a partial-sector write was lost"
for h in handles:
    h.shutdown()
srv.stop()
print(f"ok: {len(cookies)} concurrent unaligned writes, none lost")
