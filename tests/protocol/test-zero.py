#!/usr/bin/python3
"""WRITE_ZEROES: the range reads as zeroes; without NO_HOLE it may punch
(space freed); with NO_HOLE the range stays allocated; unaligned ranges
leave neighbouring bytes alone; FUA and FAST_ZERO succeed on a
filesystem with fast zeroing."""
import os
import nbd
import harness

SIZE = 32 << 20
data = harness.pattern(SIZE, 31)
image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect(strict=False)
assert h.can_zero() and h.can_fast_zero()
mirror = bytearray(data)


def allocated():
    return os.stat(image).st_blocks * 512


def zero(off, n, flags):
    h.zero(n, off, flags)
    mirror[off:off + n] = bytes(n)
    assert h.pread(SIZE, 0) == bytes(mirror), f"after zero of {n} at {off} flags {flags}"


before = allocated()
zero(1 << 20, 4 << 20, 0)                       # may punch
punched = before - allocated()
assert punched >= 4 << 20, f"zero without NO_HOLE freed only {punched} bytes"

before = allocated()
zero(8 << 20, 4 << 20, nbd.CMD_FLAG_NO_HOLE)    # must stay allocated
assert allocated() >= before, "NO_HOLE zero deallocated the range"

zero(16 << 20, 1 << 20, nbd.CMD_FLAG_FUA | nbd.CMD_FLAG_FAST_ZERO)
zero(20 << 20 | 3, 10000, 0)                     # unaligned both ends
zero(22 << 20 | 100, 50, nbd.CMD_FLAG_NO_HOLE)   # inside one sector
zero(SIZE - 4096, 4096, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
h.flush()
h.shutdown()
srv.stop()
with open(image, "rb") as f:
    assert f.read() == bytes(mirror), "file differs after zeroes"
print("ok: zero with and without NO_HOLE, FUA, FAST_ZERO, unaligned")
