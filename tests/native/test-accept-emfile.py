#!/usr/bin/python3
"""Out of descriptors, mloop-server neither spins nor dies: started with
an open-files limit of 64 (soft and hard, so it cannot raise it), 100
idle connections leave some queued in the listen backlog, accept() fails
with EMFILE, and the server backs off (under 0.3 s of CPU in 2 s, where a
busy loop would burn all of it).  Once the idle clients close, the queued
connections are accepted in turn, and a libnbd client reads and writes."""
import socket
import time

import harness
import netserver

if harness.VALGRIND:
    harness.skip("valgrind fixes the open-files limit itself")
image = harness.make_image(1 << 20)
srv = netserver.NetServer(image, ["--handshake-timeout", "60"], nofile=(64, 64))
socks = []
harness.on_exit(lambda: [s.close() for s in socks])
for _ in range(100):
    socks.append(socket.create_connection(srv.addr))
deadline = time.monotonic() + 5
while srv.fds() < 64 and time.monotonic() < deadline:
    time.sleep(0.05)
assert srv.fds() == 64, f"expected the server at its limit, has {srv.fds()} fds"
cpu0 = srv.cpu_seconds()
time.sleep(2)
cpu = srv.cpu_seconds() - cpu0
assert cpu < 0.3, f"server used {cpu:.2f} s of CPU in 2 s at EMFILE: spinning"
assert srv.alive()
for s in socks:
    s.close()
h = srv.connect()
h.pwrite(b"e" * 4096, 0)
assert h.pread(4096, 0) == b"e" * 4096
h.shutdown()
srv.stop()
print(f"ok: at EMFILE the server used {cpu:.2f} s of CPU in 2 s, then served again")
