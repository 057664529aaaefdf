#!/usr/bin/python3
"""An image deleted while served goes on being served from the open
descriptor (as a loop device would), and one truncated to nothing fails
reads with EIO; the server never crashes."""
import errno
import os
import harness

SIZE = 4 << 20
data = harness.pattern(SIZE, 61)
image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect()
os.unlink(image)
assert h.pread(SIZE, 0) == data, "deleted image no longer readable"
h.pwrite(b"z" * 4096, 0)
assert h.pread(4096, 0) == b"z" * 4096
h.shutdown()
srv.stop()

image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect()
os.truncate(image, 0)
harness.expect_error(errno.EIO, h.pread, 4096, 0)
harness.expect_error(errno.EIO, h.pread, 4096, SIZE - 4096)
h.shutdown()
h2 = srv.connect()                      # still accepting connections
assert h2.get_size() == SIZE
h2.shutdown()
srv.stop()
assert "Input/output error" in srv.log_text()
print("ok: deleted image still served; emptied image -> EIO; server alive")
