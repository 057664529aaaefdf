#!/usr/bin/python3
"""An idle connection costs the pages it has used, not all it could,
and gives back the buffers it kept once it has been idle a while.

A process that holds many devices holds four connections for each, most
of them idle after a few reads (a partition scan, a mount).  200
connections each make one 4 KiB read and stay; the server's resident
memory may grow by at most 32 KiB a connection.  Before, each
connection's 128 request slots were zeroed and chained up front (about
48 KiB written per connection whatever it did).  Then 50 connections
each read 8 x 128 KiB at once, which each keeps for its next requests
(up to 1 MiB a connection), and go idle: within 15 s (a worker gives
memory back after 5 s without an event) they may hold at most 32 KiB
each again.  Before, the kept buffers stayed for as long as the
connection.  About 8 s."""
import os
import time

import nbd

import harness
import netserver

if harness.VALGRIND or harness.SANITIZED:
    harness.skip("resident memory means nothing under valgrind or a sanitizer")
# meson's MALLOC_PERTURB_ has glibc write every byte malloc hands out:
# the pages a connection never uses would be touched by the test itself.
os.environ.pop("MALLOC_PERTURB_", None)

CONNECTIONS, PER_CONNECTION = 200, 32 << 10
READERS, READS, READ = 50, 8, 128 << 10
SETTLE = 15

image = harness.make_image(16 << 20)
srv = netserver.NetServer(image, unix=True, nofile=4096)
handles = []


def disconnect_all():
    for h in handles:
        netserver.disconnect(h)
    handles.clear()


def connect():
    h = nbd.NBD()
    h.connect_uri(srv.uri)
    handles.append(h)
    return h


harness.on_exit(disconnect_all)
connect().pread(4096, 0)
before = srv.status_kib("VmRSS") << 10
for i in range(CONNECTIONS):
    assert connect().pread(4096, (i % 4096) * 4096) == bytes(4096), "a read of zeros"
after = srv.status_kib("VmRSS") << 10
each = (after - before) // CONNECTIONS
print(f"{CONNECTIONS} idle connections: {(after - before) >> 10} KiB more resident, "
      f"{each >> 10} KiB each")
assert each <= PER_CONNECTION, \
    f"an idle connection that made one read costs {each >> 10} KiB resident " \
    f"(at most {PER_CONNECTION >> 10} KiB): its unused request slots were touched"
disconnect_all()

connect().pread(4096, 0)
time.sleep(6)                   # the first trim, of the fresh server's heap
before = srv.status_kib("VmRSS") << 10
readers = [connect() for _ in range(READERS)]
pending = [(h, h.aio_pread(nbd.Buffer(READ), ((i * READS + k) % 128) * READ))
           for i, h in enumerate(readers) for k in range(READS)]
for h, cookie in pending:
    while not h.aio_command_completed(cookie):
        h.poll(-1)
busy = srv.status_kib("VmRSS") << 10
deadline = time.monotonic() + SETTLE
while True:
    rss = srv.status_kib("VmRSS") << 10
    each = max(rss - before, 0) // READERS
    if each <= PER_CONNECTION or time.monotonic() > deadline:
        break
    time.sleep(0.5)
print(f"{READERS} connections after {READS} x {READ >> 10} KiB reads each: "
      f"{(busy - before) >> 10} KiB more resident, {(rss - before) >> 10} KiB once idle")
assert each <= PER_CONNECTION, \
    f"{SETTLE} s idle, a connection that read {READS} x {READ >> 10} KiB still " \
    f"costs {each >> 10} KiB resident: it kept its buffers"
disconnect_all()
srv.stop()
print("ok: an idle connection costs only what it used, and keeps no buffers")
