#!/usr/bin/python3
"""mloop-server's AIO contexts wait for the first request and grow with
the load (none for a connection that sends nothing, one small context
for one request, deeper ones for 128 at once).  Short of kernel AIO
events, the server still serves every request correctly: a small queue depth only limits how much is in flight, a
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
import signal

import harness
import procstop  # tests/: a SIGSTOP that has taken effect

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


def burst_of_reads(srv, handles):
    """128 reads that reach the server at once, so that its context
    fills whatever the machine's speed: the server is stopped while they
    are sent (they fit the sockets' buffers) and resumed after.  Sent
    one by one to a running server, each may be done before the next
    arrives and the context never fills."""
    cookies = []
    procstop.sigstop(srv.proc.pid)
    try:
        for h in handles:
            for i in range(REQUESTS):
                buf = bytearray(4096)
                cookies.append((h, h.aio_pread(buf, i * BLOCK)))
        for h in handles:
            # libnbd sends while the socket takes it; flush what it may
            # still hold (2 is LIBNBD_AIO_DIRECTION_WRITE).
            for _ in range(1000):
                if not h.aio_get_direction() & 2:
                    break
                h.poll(0)
    finally:
        os.kill(srv.proc.pid, signal.SIGCONT)
    for h, cookie in cookies:
        while not h.aio_command_completed(cookie):
            h.poll(-1)


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


def aio_maps(srv):
    """The sizes in KiB of the server's AIO rings: io_setup maps one
    "[aio]" area per context, larger for a deeper one."""
    sizes = []
    with open(f"/proc/{srv.proc.pid}/maps") as f:
        for line in f:
            if "/[aio]" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                sizes.append((hi - lo) // 1024)
    return sorted(sizes)


image = harness.make_image(SIZE)
figures = []

# 0. mloop-server: no context until a request comes, then a small one,
#    and a deeper one under 128 requests at once (the old one destroyed
#    once drained).
if harness.SERVER_KIND == "native" and not harness.VALGRIND:
    srv = serve(["threads=1"])
    h = srv.connect()
    idle = aio_maps(srv)
    assert idle == [], f"AIO rings before any request: {idle} KiB"
    h.pread(4096, 0)
    first = aio_maps(srv)
    assert len(first) == 1, f"after one read: AIO rings {first} KiB"
    h2 = srv.connect()
    burst_of_reads(srv, [h, h2])
    grown = aio_maps(srv)
    assert len(grown) == 1 and grown[0] > first[0], \
        f"after 128 requests at once: AIO rings {grown} KiB (first {first} KiB)"
    for x in (h, h2):
        x.shutdown()
    srv.stop()
    figures.append(f"AIO rings: none idle, {first} KiB after one read, "
                   f"{grown} KiB under 128 requests at once")

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
