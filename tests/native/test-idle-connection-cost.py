#!/usr/bin/python3
"""An idle connection costs the pages it has used, not all it could.

A process that holds many devices holds four connections for each, most
of them idle after a few reads (a partition scan, a mount).  200
connections each make one 4 KiB read and stay; the server's resident
memory may grow by at most 32 KiB a connection.  Before, each
connection's 128 request slots were zeroed and chained up front (about
48 KiB written per connection whatever it did).  About 2 s."""
import os

import nbd

import harness
import netserver

if harness.VALGRIND or harness.SANITIZED:
    harness.skip("resident memory means nothing under valgrind or a sanitizer")
# meson's MALLOC_PERTURB_ has glibc write every byte malloc hands out:
# the pages a connection never uses would be touched by the test itself.
os.environ.pop("MALLOC_PERTURB_", None)

CONNECTIONS, PER_CONNECTION = 200, 32 << 10

image = harness.make_image(16 << 20)
srv = netserver.NetServer(image, unix=True, nofile=4096)
handles = []


def disconnect_all():
    for h in handles:
        netserver.disconnect(h)


harness.on_exit(disconnect_all)
warm = nbd.NBD()
warm.connect_uri(srv.uri)
handles.append(warm)
warm.pread(4096, 0)
before = srv.status_kib("VmRSS") << 10
for i in range(CONNECTIONS):
    h = nbd.NBD()
    h.connect_uri(srv.uri)
    handles.append(h)
    assert h.pread(4096, (i % 4096) * 4096) == bytes(4096), "a read of zeros"
after = srv.status_kib("VmRSS") << 10
each = (after - before) // CONNECTIONS
print(f"{CONNECTIONS} idle connections: {(after - before) >> 10} KiB more resident, "
      f"{each >> 10} KiB each")
assert each <= PER_CONNECTION, \
    f"an idle connection that made one read costs {each >> 10} KiB resident " \
    f"(at most {PER_CONNECTION >> 10} KiB): its unused request slots were touched"
disconnect_all()
handles.clear()
srv.stop()
print("ok: an idle connection costs only what it used")
