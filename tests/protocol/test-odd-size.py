#!/usr/bin/python3
"""An image whose size is not a multiple of the block size: its last,
partial block reads and writes correctly, and the file neither grows
nor shrinks."""
import harness

SIZE = 1 << 20 | 1000
data = harness.pattern(SIZE, 11)
image = harness.make_image(SIZE, data=data)
srv = harness.Server(image)
h = srv.connect(strict=False)
assert h.get_size() == SIZE
assert h.pread(SIZE, 0) == data, "whole image read back differs"
assert h.pread(1000, SIZE - 1000) == data[-1000:]
mirror = bytearray(data)
for off, n in [(SIZE - 3, 3), (SIZE - 1000, 1000), (SIZE - 600, 100), ((1 << 20) - 100, 300)]:
    new = harness.pattern(n, off)
    h.pwrite(new, off)
    mirror[off:off + n] = new
    assert h.pread(SIZE, 0) == bytes(mirror), f"after writing {n} bytes at {off}"
h.flush()
h.shutdown()
srv.stop()
with open(image, "rb") as f:
    on_disk = f.read()
assert len(on_disk) == SIZE, f"file size changed to {len(on_disk)}"
assert on_disk == bytes(mirror), "file differs from what was written"
print("ok: odd-sized image, last partial block read and written, size unchanged")
