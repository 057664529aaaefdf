#!/usr/bin/python3
"""Reads past the end fail with EINVAL, writes past the end with ENOSPC;
the file is unchanged and the server goes on serving."""
import errno
import harness

SIZE = 4 << 20
image = harness.make_image(SIZE, data=harness.pattern(SIZE, 1))
before = harness.file_digest(image)
srv = harness.Server(image)
h = srv.connect(strict=False)   # let the requests reach the server

harness.expect_error(errno.EINVAL, h.pread, 4096, SIZE)
harness.expect_error(errno.EINVAL, h.pread, 8192, SIZE - 4096)
harness.expect_error(errno.ENOSPC, h.pwrite, b"x" * 4096, SIZE)
harness.expect_error(errno.ENOSPC, h.pwrite, b"x" * 8192, SIZE - 4096)
# Still serving, on the same connection.
assert h.pread(4096, 0) == harness.pattern(SIZE, 1)[:4096]
h.shutdown()
srv.stop()
assert harness.file_digest(image) == before, "file changed"
print("ok: EINVAL past the end on read, ENOSPC on write, file unchanged")
