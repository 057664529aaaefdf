#!/usr/bin/python3
"""FAST_ZERO with NO_HOLE on a filesystem that cannot zero a range in
place (tmpfs has no FALLOC_FL_ZERO_RANGE) fails quickly with ENOTSUP and
changes nothing; the same request without FAST_ZERO writes zeroes."""
import errno
import os
import nbd
import harness

mnt = harness.mount_tmpfs("64m", "a filesystem without FALLOC_FL_ZERO_RANGE")

SIZE = 8 << 20
data = harness.pattern(SIZE, 41)
image = harness.make_image(SIZE, data=data, directory=mnt)
srv = harness.Server(image)
h = srv.connect()
harness.expect_error(errno.ENOTSUP, h.zero, 1 << 20, 1 << 20,
                     nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
assert h.pread(SIZE, 0) == data, "a refused fast zero changed data"
h.zero(1 << 20, 1 << 20, nbd.CMD_FLAG_NO_HOLE)   # slow path is fine
assert h.pread(1 << 20, 1 << 20) == bytes(1 << 20)
h.zero(1 << 20, 3 << 20, nbd.CMD_FLAG_FAST_ZERO)  # punching is fast here
assert h.pread(1 << 20, 3 << 20) == bytes(1 << 20)
h.shutdown()
srv.stop()
# A refused fast zero is expected by the client, not an IO error to log.
assert "error: zero" not in srv.log_text(), srv.log_text()
print("ok: FAST_ZERO refused with ENOTSUP and nothing changed; slow zero works")
