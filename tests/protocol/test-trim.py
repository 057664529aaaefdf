#!/usr/bin/python3
"""TRIM punches a hole: the range reads back as zeroes, its blocks are
freed, the bytes around it are untouched (also for unaligned ranges),
FUA trim works, and discard=off withdraws TRIM."""
import os
import nbd
import harness

SIZE = 16 << 20
data = harness.pattern(SIZE, 21)
image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect(strict=False)
assert h.can_trim()
mirror = bytearray(data)
blocks_before = os.stat(image).st_blocks

for off, n, flags in [(1 << 20, 4 << 20, 0), (8 << 20, 1 << 20, nbd.CMD_FLAG_FUA),
                      (10 << 20 | 100, 70000, 0), (12 << 20 | 7, 300, 0)]:
    h.trim(n, off, flags)
    mirror[off:off + n] = bytes(n)
    assert h.pread(SIZE, 0) == bytes(mirror), f"after trim of {n} at {off}"
h.flush()
h.shutdown()
srv.stop()
with open(image, "rb") as f:
    assert f.read() == bytes(mirror), "file differs after trims"
freed = (blocks_before - os.stat(image).st_blocks) * 512
if harness.file_only("the blocks a trim frees"):
    assert freed >= 5 << 20, f"trim freed only {freed} bytes"

srv = harness.Server(image, ["discard=off"])
h = srv.connect()
assert not h.can_trim(), "discard=off still advertises TRIM"
h.shutdown()
srv.stop()
freed = f"{freed >> 20} MiB freed" if harness.STORE == "file" else "an RBD image"
print(f"ok: trims read back as zeroes, {freed}, discard=off honoured")
