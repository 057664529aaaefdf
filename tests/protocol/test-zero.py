#!/usr/bin/python3
"""WRITE_ZEROES: the range reads as zeroes; without NO_HOLE it may punch
(space freed, on a file); with NO_HOLE the range stays allocated;
unaligned ranges leave neighbouring bytes alone; FUA and FAST_ZERO
succeed on a filesystem with fast zeroing.  On an RBD image, FAST_ZERO
with NO_HOLE is refused with ENOTSUP (its zeroes in place are written
byte by byte) and changes nothing."""
import errno
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
    return harness.allocated_bytes(image)


def zero(off, n, flags):
    h.zero(n, off, flags)
    mirror[off:off + n] = bytes(n)
    assert h.pread(SIZE, 0) == bytes(mirror), f"after zero of {n} at {off} flags {flags}"


before = allocated()
zero(1 << 20, 4 << 20, 0)                       # may punch
punched = before - allocated()
if harness.file_only("the blocks a zero without NO_HOLE frees"):
    assert punched >= 4 << 20, f"zero without NO_HOLE freed only {punched} bytes"

before = allocated()
zero(8 << 20, 4 << 20, nbd.CMD_FLAG_NO_HOLE)    # must stay allocated
assert allocated() >= before, "NO_HOLE zero deallocated the range"

zero(16 << 20, 1 << 20, nbd.CMD_FLAG_FUA | nbd.CMD_FLAG_FAST_ZERO)
zero(20 << 20 | 3, 10000, 0)                     # unaligned both ends
zero(22 << 20 | 100, 50, nbd.CMD_FLAG_NO_HOLE)   # inside one sector
if harness.STORE == "file":
    zero(SIZE - 4096, 4096, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
else:
    harness.expect_error(errno.ENOTSUP, h.zero, 4096, SIZE - 4096,
                         nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    assert h.pread(SIZE, 0) == bytes(mirror), "a refused fast zero changed data"
h.flush()
h.shutdown()
srv.stop()
with open(image, "rb") as f:
    assert f.read() == bytes(mirror), "file differs after zeroes"
print("ok: zero with and without NO_HOLE, FUA, FAST_ZERO, unaligned")
