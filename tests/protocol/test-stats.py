#!/usr/bin/python3
"""The request counters `mloop status` shows (nbd/stats.h): the server keeps
them in a shared file (plugin stats=FILE, mloop-server --stats-file FILE);
they count connections, requests per command, bytes and errors exactly,
and nothing stays in flight."""
import os
import struct
import time

import nbd
import harness

FIELDS = ["magic", "connections", "connections_total",
          "read", "write", "flush", "trim", "zero", "other",
          "bytes_read", "bytes_written", "errors", "in_flight"]
MAGIC = 0x317473706f6f6c6d


def counters(path):
    with open(path, "rb") as f:
        raw = f.read(8 * len(FIELDS))
    c = dict(zip(FIELDS, struct.unpack(f"<{len(FIELDS)}Q", raw)))
    assert c["magic"] == MAGIC, f"bad magic {c['magic']:#x}"
    return c


def wait_for(path, field, value):
    deadline = time.monotonic() + 10
    while counters(path)[field] != value:
        assert time.monotonic() < deadline, \
            f"{field} is {counters(path)[field]}, expected {value}"
        time.sleep(0.05)


image = harness.make_image(16 << 20)
stats = os.path.join(harness.tmpdir(), "stats")
srv = harness.Server(image, params=[f"stats={stats}"])
a, b = srv.connect(), srv.connect(strict=False)
wait_for(stats, "connections", 2)

for i in range(3):
    a.pwrite(harness.pattern(65536, i), i * 65536)
b.pread(4096, 0)
b.pread(8192, 1 << 20)
a.flush()
b.trim(65536, 4 << 20)
a.zero(65536, 8 << 20)
c = counters(stats)
expected = {"read": 2, "write": 3, "flush": 1, "trim": 1, "zero": 1,
            "bytes_read": 4096 + 8192, "bytes_written": 3 * 65536,
            "errors": 0, "in_flight": 0, "connections_total": 2}
wrong = {k: (c[k], v) for k, v in expected.items() if c[k] != v}
assert not wrong, f"counters (got, expected): {wrong}"

# nbdkit refuses an out-of-range request itself, before the plugin sees
# it, so only mloop-server can count it.
if harness.SERVER_KIND == "native":
    harness.expect_error(22, b.pread, 4096, 16 << 20)
    c = counters(stats)
    assert c["errors"] == 1 and c["read"] == 3, f"error not counted: {c}"

a.shutdown()
b.shutdown()
wait_for(stats, "connections", 0)
srv.stop()
print("ok: stats counters exact")
