#!/usr/bin/python3
"""FUA writes and FLUSH succeed and land in the image (the file, or the
RBD image as another client reads it), and the plugin advertises both
(so the kernel client will send them)."""
import os
import nbd
import harness

image = harness.make_image(8 << 20)
srv = harness.Server(image)
h = srv.connect()
assert h.can_fua(), "FUA not advertised"
assert h.can_flush(), "FLUSH not advertised"

for i, (off, n) in enumerate([(0, 4096), (1 << 20, 1 << 20), (8192, 512)]):
    data = harness.pattern(n, i + 7)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA)
    assert harness.read_image(image, off, n) == data, f"FUA write at {off} not in the image"
h.flush()
h.shutdown()
srv.stop()
print("ok: FUA writes and flush")
