#!/usr/bin/python3
"""nbdkit -r: every write fails with EPERM and the file's bytes and
mtime are unchanged."""
import errno
import os
import harness

SIZE = 1 << 20
image = harness.make_image(SIZE, data=harness.pattern(SIZE, 3))
os.utime(image, (1_000_000_000, 1_000_000_000))
before = harness.file_digest(image)
srv = harness.Server(image, nbdkit_args=["-r"])
h = srv.connect(strict=False)
assert h.is_read_only()
harness.expect_error(errno.EPERM, h.pwrite, b"y" * 4096, 0)
assert h.pread(4096, 0) == harness.pattern(SIZE, 3)[:4096]
h.shutdown()
srv.stop()
assert harness.file_digest(image) == before, "file changed"
assert os.stat(image).st_mtime == 1_000_000_000, "mtime changed"
print("ok: read-only export refuses writes with EPERM")
