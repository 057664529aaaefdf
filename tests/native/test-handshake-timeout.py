#!/usr/bin/python3
"""--handshake-timeout: a client that connects and sends nothing, or
trickles its handshake a byte at a time, is dropped when the timeout
passes since it connected (not before, and within a second after), over
TCP and a Unix socket; meanwhile a normal client negotiates and reads and
writes, and a negotiated client that then sits idle is not dropped."""
import socket
import struct
import threading
import time

import harness
import netserver
import nbdwire as nw

TIMEOUT = 2
# Under valgrind the server starts and answers slowly, not its clock.
LATE = 3.0 if harness.VALGRIND else 1.0

image = harness.make_image(1 << 20)
measured = []

for unix in (False, True):
    srv = netserver.NetServer(image, ["--handshake-timeout", str(TIMEOUT)], unix=unix)
    kind = "unix" if unix else "tcp"

    # A silent client, one that reads the greeting and says nothing, and
    # one that trickles a valid handshake one byte every 0.4 s: each
    # would take 7 s to send, so only the overall deadline can stop it.
    family = socket.AF_UNIX if unix else socket.AF_INET
    silent = socket.socket(family, socket.SOCK_STREAM)
    harness.on_exit(silent.close)
    t0 = time.monotonic()
    silent.connect(srv.addr)
    greeted = nw.Wire(srv.addr)
    harness.on_exit(greeted.close)
    greeted.recv_exact(18)
    trickler = nw.Wire(srv.addr)
    harness.on_exit(trickler.close)
    trickler.recv_exact(18)
    script = struct.pack(">I", 3) + struct.pack(">QII", nw.IHAVEOPT, nw.OPT_GO, 6) + struct.pack(">IH", 0, 0)
    stop = threading.Event()

    def trickle():
        for b in script:
            if stop.wait(0.4):
                return
            try:
                trickler.s.sendall(bytes([b]))
            except OSError:
                return  # dropped, as it should be
    t = threading.Thread(target=trickle)
    t.start()
    harness.on_exit(stop.set)

    # Meanwhile a normal client works, and stays connected past the timeout.
    h = srv.connect()
    harness.on_exit(lambda h=h: netserver.disconnect(h))
    h.pwrite(b"a" * 4096, 0)
    assert h.pread(4096, 0) == b"a" * 4096

    results = {}

    def watch_from_t0(name, s):
        try:
            netserver.wait_eof(s, TIMEOUT + LATE + 2)
            results[name] = time.monotonic() - t0
        except AssertionError as e:
            results[name] = e
    watchers = [threading.Thread(target=watch_from_t0, args=a)
                for a in (("silent", silent), ("greeted", greeted.s), ("trickler", trickler.s))]
    for w in watchers:
        w.start()
    for w in watchers:
        w.join()
    stop.set()
    t.join()
    for name, r in results.items():
        assert not isinstance(r, Exception), f"{kind} {name}: {r}"
        # The deadline starts a moment after connect; allow 0.2 s of slack.
        assert TIMEOUT - 0.2 <= r <= TIMEOUT + LATE, f"{kind} {name}: dropped after {r:.2f} s"
        measured.append(f"{kind} {name} {r:.2f} s")

    # The negotiated client outlived the handshake timeout.
    h.pwrite(b"b" * 4096, 4096)
    assert h.pread(8192, 0) == b"a" * 4096 + b"b" * 4096
    h.shutdown()
    # And a fresh one negotiates as usual.
    h2 = srv.connect()
    assert h2.pread(4096, 4096) == b"b" * 4096
    h2.shutdown()
    srv.stop()

print(f"ok: idle and trickling handshakes dropped after {TIMEOUT} s: " + ", ".join(measured))
