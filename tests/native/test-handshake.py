#!/usr/bin/python3
"""mloop-server's negotiation, byte by byte: unknown options are refused
and negotiation goes on, INFO then GO, LIST, export names of 0, 4096 and
4097 bytes, ABORT with and without data, a declared option length of 0xffffffff, and EOF at every
byte of a recorded handshake — the server keeps serving others."""
import struct
import harness
import nbdwire as nw

if harness.SERVER_KIND != "native":
    harness.skip("handshake tests are for mloop-server")

image = harness.make_image(1 << 20, data=b"hello")
srv = harness.Server(image)


def negotiated(w):
    """After GO: a read of the first 5 bytes works."""
    w.request(nw.CMD_READ, 0, 512, cookie=7)
    err, cookie, data = w.simple_reply(512)
    assert err == 0 and cookie == 7 and data[:5] == b"hello"


# Unknown option, then GO.
w = nw.Wire(srv.sock)
assert w.greeting() & 1, "fixed newstyle not offered"
w.option(12345, b"junk")
assert w.reply()[1] == nw.REP_ERR_UNSUP
replies = w.go(info=[3])
assert replies[-1][1] == nw.REP_ACK
infos = {struct.unpack(">H", r[2][:2])[0]: r[2] for r in replies if r[1] == nw.REP_INFO}
size, flags = struct.unpack(">QH", infos[0][2:])
assert size == 1 << 20
mn, pref, mx = struct.unpack(">III", infos[3][2:])
# Any request is served; the O_DIRECT alignment is preferred.
assert mn == 1 and pref >= 512 and pref & (pref - 1) == 0 and mx >= 32 << 20
assert not flags & (1 << 7), "DF offered without structured replies"
negotiated(w)
w.close()

# INFO, LIST, then GO.
w = nw.Wire(srv.sock)
w.greeting()
w.option(nw.OPT_INFO, struct.pack(">IH", 0, 0))
while w.reply()[1] == nw.REP_INFO:
    pass
w.option(nw.OPT_LIST)
assert w.reply()[1] == nw.REP_SERVER and w.reply()[1] == nw.REP_ACK
assert w.go()[-1][1] == nw.REP_ACK
negotiated(w)
w.close()

# Export names of 0 and 4096 bytes are fine; 4097 is invalid.
for n, ok in [(0, True), (4096, True), (4097, False)]:
    w = nw.Wire(srv.sock)
    w.greeting()
    last = w.go(name=b"x" * n)[-1]
    assert (last[1] == nw.REP_ACK) == ok, f"name of {n} bytes: reply {last[1]:#x}"
    if ok:
        negotiated(w)
    w.close()

# ABORT is acknowledged whatever data comes with it (the spec: ignore
# it), even more than any other option may carry; then the server closes.
for n in (0, 16, 8000):
    w = nw.Wire(srv.sock)
    w.greeting()
    w.option(nw.OPT_ABORT, b"a" * n)
    assert w.reply()[1] == nw.REP_ACK, f"ABORT with {n} bytes not acknowledged"
    try:
        assert w.s.recv(1) == b"", "server sent more after acking ABORT"
    except ConnectionResetError:
        pass
    w.close()

# A declared length of 0xffffffff: never read or allocated; disconnect.
w = nw.Wire(srv.sock)
w.greeting()
w.option(nw.OPT_GO, b"", declared_len=0xFFFFFFFF)
try:
    w.reply()
    raise AssertionError("server answered a 4 GiB option")
except (EOFError, ConnectionResetError):
    pass
w.close()

# EOF at every byte of a recorded handshake (greeting reply + GO).
script = struct.pack(">I", 3) + struct.pack(">QII", nw.IHAVEOPT, nw.OPT_GO, 6) + struct.pack(">IH", 0, 0)
for cut in range(len(script)):
    w = nw.Wire(srv.sock)
    w.recv_exact(18)
    w.s.sendall(script[:cut])
    w.close()

# Still serving, through libnbd as well.
h = srv.connect()
assert h.pread(512, 0)[:5] == b"hello"
h.shutdown()
srv.stop()
print(f"ok: negotiation edge cases, {len(script)} truncated handshakes, server still serving")
