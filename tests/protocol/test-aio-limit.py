#!/usr/bin/python3
"""Short of kernel AIO events, the server still serves every request
correctly: a small queue depth only limits how much is in flight, a
system at fs.aio-max-nr gets smaller AIO contexts (or, for mloop-server,
the helper threads) and one line in the log saying which limit and how
to raise it, and a system with no room at all refuses to start, in that
one line.

The limit is met through MLOOP_TEST_AIO_MAX=N, a test switch that makes
io_setup fail with EAGAIN once the server would hold more than N events,
as fs.aio-max-nr does system-wide: lowering the real sysctl here would
starve every other process on the machine.  The kernel tests meet the
real one (tests/kernel/test-many-devices.py)."""
import os

import harness

BLOCK = 64 << 10
REQUESTS = 64
SIZE = 2 * REQUESTS * BLOCK


def hammer(handles, seed):
    """REQUESTS concurrent writes then reads per handle, each its own
    pattern at its own offset; checks every byte read back."""
    expected = {}
    cookies = []
    for c, h in enumerate(handles):
        for i in range(REQUESTS):
            off = (c * REQUESTS + i) * BLOCK % SIZE
            data = harness.pattern(BLOCK, seed + c * REQUESTS + i)
            expected[off] = data
            cookies.append((h, h.aio_pwrite(data, off)))
    for h, cookie in cookies:
        while not h.aio_command_completed(cookie):
            h.poll(-1)
    reads = []
    for c, h in enumerate(handles):
        for off in expected:
            buf = bytearray(BLOCK)
            reads.append((h, off, buf, h.aio_pread(buf, off)))
    for h, off, buf, cookie in reads:
        while not h.aio_command_completed(cookie):
            h.poll(-1)
        assert bytes(buf) == expected[off], f"data at {off} differs"
    return len(cookies) + len(reads)


def serve(params, limit=None):
    if limit is None:
        os.environ.pop("MLOOP_TEST_AIO_MAX", None)
    else:
        os.environ["MLOOP_TEST_AIO_MAX"] = str(limit)
    try:
        return harness.Server(image, params=params)
    finally:
        os.environ.pop("MLOOP_TEST_AIO_MAX", None)


def limit_lines(srv):
    return [l for l in srv.log_text().splitlines()
            if "kernel AIO events exhausted" in l]


image = harness.make_image(SIZE)
figures = []

# 1. A queue depth of 8 and one worker (or ring): 64 requests in flight
#    from each of two connections wait their turn, none fails.
srv = serve(["threads=1", "queue-depth=8"])
handles = [srv.connect(), srv.connect()]
n = hammer(handles, 1)
for h in handles:
    h.shutdown()
srv.stop()
figures.append(f"queue-depth=8: {n} requests, 128 at once, all correct")

# 2. Room for fewer events than two rings want.  mloop-server: the first
#    worker's context is cut from 32 to 16, the second finds no room even
#    for the floor (8) and serves through the helpers.  The plugin: its
#    two rings of 33 are cut to 16 and 8.
limit = 20 if harness.SERVER_KIND == "native" else 24
srv = serve(["threads=2"], limit)
handles = [srv.connect(), srv.connect()]
n = hammer(handles, 2)
n += hammer(handles, 3)
for h in handles:
    h.shutdown()
lines = limit_lines(srv)
srv.stop()
assert len(lines) == 1, f"expected one line about the limit, got {lines}"
assert f"MLOOP_TEST_AIO_MAX={limit}" in lines[0], lines[0]
figures.append(f"at the limit ({limit} events): {n} requests correct, "
               f"logged once: {lines[0].strip()}")

# 3. No room even for the smallest context: refused at start, in one line.
try:
    srv = serve([], 4)
except RuntimeError as e:
    msg = str(e)
    assert "kernel AIO events exhausted" in msg and "MLOOP_TEST_AIO_MAX=4" in msg, msg
    figures.append("no room: refused at start")
else:
    srv.stop()
    raise AssertionError("the server started with no room for an AIO context")

for f in figures:
    print("ok:", f)
