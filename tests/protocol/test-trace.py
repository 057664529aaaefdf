#!/usr/bin/python3
"""The per-request trace (nbd/trace.h; plugin trace=FILE, mloop-server
--trace FILE, or MLOOP_TRACE=FILE for either): one line per event, each
request's events in order with CLOCK_MONOTONIC times, every request
accounted for.  mloop-server names requests by the cookie the client
sent and records recv, submit (AIO only: not for an RBD image), complete
and reply; the plugin, which nbdkit gives no cookie, numbers them and
records recv and return.
"""
import os
import re
import time

import nbd
import harness

LINE = re.compile(r"^(\d+)\.(\d{9}) (\d+)/(\d+) (\w+) conn=(\d+) "
                  r"(cookie=[0-9a-f]{16}|seq=\d+) (\S+) (\d+)\+(\d+)( error=\d+)?$")


def parse(path):
    events = []
    with open(path) as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            assert m, f"malformed trace line {line!r}"
            events.append({"t": int(m.group(1)) + int(m.group(2)) / 1e9,
                           "event": m.group(5), "id": (m.group(6), m.group(7)),
                           "cmd": m.group(8), "off": int(m.group(9)),
                           "len": int(m.group(10)),
                           "error": int(m.group(11)[7:]) if m.group(11) else 0})
    return events


image = harness.make_image(16 << 20)
trace = os.path.join(harness.tmpdir(), "trace")
before = time.clock_gettime(time.CLOCK_MONOTONIC)
srv = harness.Server(image, params=[f"trace={trace}"])
h = srv.connect(strict=False)  # the read past the end must reach the server
cookies = {}
cookies[h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(harness.pattern(8192, 1))), 65536)] = ("write", 65536, 8192)
cookies[h.aio_pread(nbd.Buffer(4096), 0)] = ("read", 0, 4096)
cookies[h.aio_flush()] = ("flush", 0, 0)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.trim(4096, 1 << 20)
harness.expect_error(22, h.pread, 4096, (16 << 20) - 512)   # past the end
h.shutdown()
srv.stop()
after = time.clock_gettime(time.CLOCK_MONOTONIC)

events = parse(trace)
assert all(before <= e["t"] <= after for e in events), \
    "trace times are not CLOCK_MONOTONIC within the test"
by_request = {}
for e in events:
    by_request.setdefault(e["id"], []).append(e)
for evs in by_request.values():
    times = [e["t"] for e in evs]
    assert times == sorted(times), f"events out of order: {evs}"

if harness.SERVER_KIND == "native":
    # The cookie is the client's, in wire order: libnbd's are 1, 2, 3...
    by_cookie = {cookie: evs for (_, cookie), evs in by_request.items()}
    # submit is io_submit, a file's: an RBD image's requests go to librbd.
    submitted = ["submit"] if harness.STORE == "file" else []
    for cookie, (cmd, off, length) in cookies.items():
        evs = by_cookie[f"cookie={cookie:016x}"]
        names = [e["event"] for e in evs]
        assert names == ["recv", *submitted, "complete", "reply"], \
            f"cookie {cookie} ({cmd}): events {names}"
        assert (evs[0]["cmd"], evs[0]["off"], evs[0]["len"]) == (cmd, off, length), \
            f"cookie {cookie}: traced as {evs[0]}"
    kinds = {tuple(e["event"] for e in evs): evs[0]["cmd"] for evs in by_request.values()}
    # Trim runs without AIO; the refused read is answered with an error;
    # the disconnect is received and never answered.
    assert kinds.get(("recv", "complete", "reply")) in ("trim", "read"), kinds
    # The error is known, and traced, when the reply is queued.
    refused = [e for e in events if e["cmd"] == "read" and e["error"]]
    assert [(e["event"], e["off"], e["error"]) for e in refused] == \
        [("complete", (16 << 20) - 512, 22)], \
        f"the refused read is not traced with its error: {refused}"
    assert any(evs[0]["cmd"] == "disc" for evs in by_request.values()), "no disc traced"
else:
    # nbdkit refuses the read past the end itself; the plugin sees four.
    got = sorted((evs[0]["cmd"], evs[0]["off"], evs[0]["len"],
                  tuple(e["event"] for e in evs)) for evs in by_request.values())
    want = sorted([(cmd, off, length, ("recv", "return")) for cmd, off, length in
                   cookies.values()] + [("trim", 1 << 20, 4096, ("recv", "return"))])
    assert got == want, f"plugin trace {got}, expected {want}"

# MLOOP_TRACE does the same without the option (how a server started by
# mloop attach or its supervisor is traced).
env_trace = os.path.join(harness.tmpdir(), "env-trace")
os.environ["MLOOP_TRACE"] = env_trace
srv = harness.Server(image)
del os.environ["MLOOP_TRACE"]
h = srv.connect()
h.pread(4096, 8192)
h.shutdown()
srv.stop()
assert [(e["event"], e["cmd"], e["off"]) for e in parse(env_trace)][:1] == \
    [("recv", "read", 8192)], "MLOOP_TRACE did not trace the read"
