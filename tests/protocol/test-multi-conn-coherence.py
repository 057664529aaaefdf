#!/usr/bin/python3
"""Multi-conn: a write completed on connection A, then a FLUSH on
connection B, is visible to connection C and durable in the image (the
file, or the RBD image as another client reads it)."""
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
    # Durable in the image: read beneath the server.
    assert harness.read_image(image, off, 65536) == data, f"round {round}: not in the image"
for h in (a, b, c):
    h.shutdown()
srv.stop()
print("ok: write on A + flush on B -> visible on C and in the image, 20 rounds")
