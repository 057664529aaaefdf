#!/usr/bin/python3
"""A client that goes away at any byte of a real handshake never crashes
or hangs mloop-server.  The bytes libnbd sends to negotiate (GO for the
export "disk", after STRUCTURED_REPLY, SET_META_CONTEXT for
base:allocation and whatever options it tries first) are recorded through
a relay; then, over TCP, for every prefix of them, a client connects,
sends the prefix and (a) shuts its side down and waits for the server to
close, which must happen within seconds, and (b) closes at once with a
reset (SO_LINGER 0) while the server may still be sending.  Afterwards the
server is alive, its fd and thread counts are back to their baseline, and
a libnbd client reads and writes.  With MLOOP_VALGRIND set, the server runs
under valgrind and must report no error."""
import socket
import struct
import threading
import time

import harness
import netserver
import nbdwire as nw

image = harness.make_image(1 << 20, data=b"hello")
srv = netserver.NetServer(image, ["--export-name", "disk", "--handshake-timeout", "30"])


def record_handshake():
    """What libnbd sends from connect to the end of negotiation."""
    relay = socket.socket()
    harness.on_exit(relay.close)
    relay.bind(("127.0.0.1", 0))
    relay.listen(1)
    sent = bytearray()
    recording = threading.Event()
    recording.set()

    def pump(src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record and recording.is_set():
                    sent.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def serve():
        c, _ = relay.accept()
        s = socket.create_connection(srv.addr)
        threads = [threading.Thread(target=pump, args=(c, s, True)),
                   threading.Thread(target=pump, args=(s, c, False))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c.close()
        s.close()
    t = threading.Thread(target=serve)
    t.start()
    import nbd
    h = nbd.NBD()
    h.set_export_name("disk")
    # With a meta context, libnbd negotiates STRUCTURED_REPLY and
    # SET_META_CONTEXT before GO: every byte of those is cut at too.
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_tcp("127.0.0.1", str(relay.getsockname()[1]))
    recording.clear()  # connected: negotiation is over, nothing in flight
    assert h.pread(512, 0)[:5] == b"hello"
    h.shutdown()
    t.join(10)
    return bytes(sent)


def baseline():
    last = None
    for _ in range(100):
        now = (srv.fds(), srv.threads())
        if now == last:
            return now
        last = now
        time.sleep(0.05)
    return last


script = record_handshake()
# Sanity: client flags, then whole options, the last a GO for "disk".
options, pos = [], 4
while pos < len(script):
    magic, opt, n = struct.unpack(">QII", script[pos:pos + 16])
    assert magic == nw.IHAVEOPT, f"bad option at byte {pos}: {script!r}"
    options.append((opt, script[pos + 16:pos + 16 + n]))
    pos += 16 + n
assert pos == len(script), script
assert options[-1][0] == nw.OPT_GO and options[-1][1][:8] == struct.pack(">I", 4) + b"disk", options
assert {nw.OPT_STRUCTURED_REPLY, nw.OPT_SET_META_CONTEXT} <= {o for o, _ in options}, options
fds0, threads0 = baseline()

slowest = 0.0
for cut in range(len(script) + 1):
    # (a) half-close after the prefix: the server must notice and close.
    s = socket.create_connection(srv.addr)
    harness.on_exit(s.close)
    s.sendall(script[:cut])
    s.shutdown(socket.SHUT_WR)
    t = netserver.wait_eof(s, 30 if harness.VALGRIND else 5)
    slowest = max(slowest, t)
    s.close()
    # (b) abortive close (RST), replies possibly still on their way.
    s = socket.create_connection(srv.addr)
    harness.on_exit(s.close)
    s.sendall(script[:cut])
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    assert srv.alive(), f"server died after a {cut}-byte handshake: {srv.log_text()}"

srv.settle(fds0, threads0, timeout=30 if harness.VALGRIND else 5)
h = srv.connect(name="disk")
h.pwrite(b"w" * 4096, 4096)
assert h.pread(512, 0)[:5] == b"hello" and h.pread(4096, 4096) == b"w" * 4096
h.shutdown()
srv.stop()
print(f"ok: {len(script) + 1} prefixes of libnbd's {len(script)}-byte handshake "
      f"(options {[o for o, _ in options]}), "
      f"half-closed and reset: server up, back to {fds0} fds and {threads0} threads, "
      f"slowest close {slowest * 1000:.0f} ms")
