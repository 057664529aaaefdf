#!/usr/bin/python3
"""Clients that pipeline large READs and never read the replies cannot
grow mloop-server past its buffer budget, and a client that reads its
replies keeps being served beside them.

100 such clients each send 40 reads of 32 MiB (1,120 bytes each on the
wire) to a server with --buffer-limit 256M --connection-buffer-limit 64M.
Its RSS must stay under the budget plus a fixed overhead: 1 MiB per
connection (what budget.h lets a connection holding nothing take) and
32 MiB for the rest of the process."""
import time

import harness
import nbdwire as nw

if harness.SERVER_KIND != "native":
    harness.skip("the buffer budget is mloop-server's")
if harness.VALGRIND or harness.SANITIZED:
    harness.skip("resident memory under valgrind or ASan says nothing about the server")

CLIENTS, READS, READ = 100, 40, 32 << 20
LIMIT = 256 << 20
data = harness.pattern(1 << 20, 4)
image = harness.make_image(64 << 20, data=data)
srv = harness.Server(image, params=["buffer-limit=256M",
                                    "connection-buffer-limit=64M"])


def rss():
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


stalled = []
for c in range(CLIENTS):
    w = nw.Wire(srv.sock)
    w.greeting()
    w.go()
    for i in range(READS):
        w.request(nw.CMD_READ, (i % 2) * READ, READ, cookie=i)
    stalled.append(w)
harness.on_exit(lambda: [w.close() for w in stalled])

good = srv.connect()
for i in range(20):
    t = time.monotonic()
    assert good.pread(4096, i * 4096) == data[i * 4096:(i + 1) * 4096], "good client got wrong data"
    assert time.monotonic() - t < 5, "good client waited behind the stalled ones"
time.sleep(2)  # let the server fill what it may
peak = rss()
bound = LIMIT + CLIENTS * (1 << 20) + (32 << 20)
print(f"RSS with {CLIENTS} stalled clients: {peak >> 20} MiB (bound {bound >> 20} MiB)")
assert peak <= bound, f"server grew to {peak >> 20} MiB, over {bound >> 20} MiB"
assert good.pread(4096, 0) == data[:4096]
for w in stalled:
    w.close()
stalled.clear()
good.shutdown()
srv.stop()
print("ok: stalled clients held within the budget, a reading client served")
