#!/usr/bin/python3
"""IO errors reach the client as the matching NBD error with one log
line, and the server goes on serving:
  - a full filesystem under a sparse image: writes fail with ENOSPC;
  - the image shrinks under the server: reads of the lost part fail
    with EIO."""
import errno
import os
import harness

# A 4 MiB filesystem holding a 64 MiB sparse image.
mnt = harness.mount_tmpfs("4m", "a full filesystem")
image = harness.make_image(64 << 20, directory=mnt)
srv = harness.Server(image)
h = srv.connect()
h.pwrite(b"a" * 4096, 0)                       # fits
harness.expect_error(errno.ENOSPC, h.pwrite, b"b" * (8 << 20), 16 << 20)
assert h.pread(4096, 0) == b"a" * 4096, "server stopped serving after ENOSPC"
h.shutdown()
srv.stop()
log = srv.log_text()
assert sum("write" in l and "No space left on device" in l for l in log.splitlines()) == 1, \
    f"expected one ENOSPC log line:\n{log}"

# The image shrinks while served.
image = harness.make_image(8 << 20, data=harness.pattern(8 << 20, 5))
srv = harness.Server(image)
h = srv.connect()
os.truncate(image, 1 << 20)
harness.expect_error(errno.EIO, h.pread, 65536, 4 << 20)
assert h.pread(4096, 0) == harness.pattern(8 << 20, 5)[:4096], "server stopped serving after EIO"
h.shutdown()
srv.stop()
assert "read" in srv.log_text() and "Input/output error" in srv.log_text()
print("ok: ENOSPC on a full filesystem, EIO on a shrunken image, server kept serving")
