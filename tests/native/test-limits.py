#!/usr/bin/python3
"""mloop-server's caps on connections and its TCP keepalive.

--max-connections 2: two clients are served; further ones are closed
before the greeting (libnbd fails to connect) and the server logs each
(test-log-limit.py: within a bound on all such lines); once a client
leaves, a new one gets in.  --max-connections-per-client 1 over TCP: a second connection
from 127.0.0.1 is refused, one from 127.0.0.2 (another loopback address)
is served.  Each TCP connection has the keepalive timer of
--keepalive IDLE:INTERVAL:COUNT (30:10:3 by default; none with off), as
/proc/net/tcp shows.  Bad values are refused in one line naming the option."""
import os
import socket
import subprocess
import time

import nbd

import harness
import netserver

image = harness.make_image(4 << 20)


def try_connect(srv, source=None):
    """A libnbd handle connected to SRV, or None if the server closed the
    connection before the handshake ended.  SOURCE: the local address to
    connect from."""
    h = nbd.NBD()
    try:
        if source:
            s = socket.socket()
            s.bind((source, 0))
            s.connect(srv.addr)
            h.connect_socket(s.detach())
        else:
            h.connect_tcp(*map(str, srv.addr))
    except (nbd.Error, OSError):
        del h
        return None
    harness.on_exit(lambda: netserver.disconnect(h))
    return h


def refusal_lines(srv):
    return [l for l in srv.log_text().splitlines()
            if "refused a connection" in l]


def wait_admitted(srv, timeout=10):
    """A client admitted once the server has counted one out (a closed
    connection is counted out when its worker sees the EOF)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = try_connect(srv)
        if h:
            return h
        time.sleep(0.1)
    raise AssertionError(f"no connection admitted within {timeout} s")


def keepalive_timers(port):
    """Seconds left on the keepalive timer of each established connection
    of PORT, on the server's side (None: another timer, or none), from
    /proc/net/tcp: "tr" 2 is the keepalive timer, "tm->when" its time
    left in clock ticks."""
    hz = os.sysconf("SC_CLK_TCK")
    timers = []
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local, state, timer = fields[1], fields[3], fields[5]
            if int(local.split(":")[1], 16) != port or state != "01":
                continue
            kind, when = timer.split(":")
            timers.append(int(when, 16) / hz if int(kind, 16) == 2 else None)
    return timers


def settled_timers(port):
    """keepalive_timers, looked at again while some connection shows
    another timer (data not yet acknowledged shows the retransmit
    timer for a moment)."""
    for _ in range(50):
        timers = keepalive_timers(port)
        if None not in timers:
            break
        time.sleep(0.1)
    return timers


def refused_at_start(*args):
    p = subprocess.run([harness.SERVER_BIN, "--listen", "tcp:127.0.0.1:0",
                        *args, image], capture_output=True, text=True,
                       timeout=30)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1, \
        f"{args}: exit {p.returncode}, {p.stderr!r}"
    assert args[0] in lines[0], f"{args}: {lines[0]!r} does not name it"


# 1. A cap on all connections.
srv = netserver.NetServer(image, ["--max-connections", "2"])
a, b = try_connect(srv), try_connect(srv)
assert a and b, "the first two connections were refused"
for _ in range(5):
    assert try_connect(srv) is None, "a third connection was served"
lines = refusal_lines(srv)
assert len(lines) == 5 and all("--max-connections 2" in l for l in lines), \
    f"refusals logged: {lines}"
assert a.pread(4096, 0) == bytes(4096), "a served client reads wrong data"
a.shutdown()
c = wait_admitted(srv)
assert c.pread(4096, 4096) == bytes(4096)
srv.stop()
print(f"ok: --max-connections 2: a log line for each of 5 refusals: {lines[0]}")

# 2. A cap per client address, and the keepalive of each connection.
srv = netserver.NetServer(image, ["--max-connections-per-client", "1"])
first = try_connect(srv)
assert first, "the first connection from 127.0.0.1 was refused"
assert try_connect(srv) is None, "a second connection from 127.0.0.1 was served"
other = try_connect(srv, source="127.0.0.2")
assert other, "127.0.0.2 was refused for 127.0.0.1's connection"
assert other.pread(512, 0) == bytes(512)
lines = refusal_lines(srv)
assert len(lines) == 1 and "127.0.0.1" in lines[0] and \
    "--max-connections-per-client 1" in lines[0], f"refusals logged: {lines}"
timers = settled_timers(srv.addr[1])
assert len(timers) == 2 and all(t is not None and 25 <= t <= 30 for t in timers), \
    f"keepalive seconds left on the server's connections: {timers}"
print(f"ok: keepalive timers (s left) {timers}")
srv.stop()

srv = netserver.NetServer(image, ["--keepalive", "off"])
h = try_connect(srv)
assert keepalive_timers(srv.addr[1]) == [None], "keepalive with --keepalive off"
h.shutdown()
srv.stop()
srv = netserver.NetServer(image, ["--keepalive", "5:2:2"])
h = try_connect(srv)
timers = settled_timers(srv.addr[1])
assert len(timers) == 1 and timers[0] is not None and timers[0] <= 5, \
    f"--keepalive 5:2:2: {timers}"
h.shutdown()
srv.stop()

# 3. Bad values.
refused_at_start("--max-connections", "-1")
refused_at_start("--max-connections-per-client", "x")
refused_at_start("--keepalive", "0:10:3")
refused_at_start("--keepalive", "30:10")
refused_at_start("--keepalive", "30:10:3:1")
print("ok: bad values refused in one line")
