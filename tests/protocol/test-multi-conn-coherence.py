#!/usr/bin/python3
"""Multi-conn: a write completed on connection A, then a FLUSH on
connection B, is visible to connection C and durable in the file."""
import os
import harness

image = harness.make_image(16 << 20)
srv = harness.Server(image)
a, b, c = srv.connect(), srv.connect(), srv.connect()
assert a.can_multi_conn() and a.can_flush() and a.can_fua()

for round in range(20):
    off = round * 65536
    data = harness.pattern(65536, round + 100)
    a.pwrite(data, off)
    b.flush()
    assert c.pread(65536, off) == data, f"round {round}: C does not see A's write after B's flush"
    # Durable in the file: read it beneath the server, bypassing the cache.
    fd = os.open(image, os.O_RDONLY)
    try:
        assert os.pread(fd, 65536, off) == data, f"round {round}: not in the file"
    finally:
        os.close(fd)
for h in (a, b, c):
    h.shutdown()
srv.stop()
print("ok: write on A + flush on B -> visible on C and in the file, 20 rounds")
