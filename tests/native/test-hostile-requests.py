#!/usr/bin/python3
"""Requests mloop-server must refuse before any IO, per the spec: an
unknown command or flag, a read longer than the maximum, an
offset+length overflowing 64 bits; each answered with EINVAL/ENOSPC on a
connection that goes on.  A bad magic or an oversized write ends only
that connection; the file is unchanged and other clients are served."""
import struct
import harness
import nbdwire as nw

if harness.SERVER_KIND != "native":
    harness.skip("wire-level request tests are for mloop-server")

EINVAL, ENOSPC = 22, 28
SIZE = 1 << 20
image = harness.make_image(SIZE, data=harness.pattern(SIZE, 5))
before = harness.file_digest(image)
srv = harness.Server(image)
bystander = srv.connect()

w = nw.Wire(srv.sock)
w.greeting()
w.go()
cases = [
    (dict(cmd=99, length=0), EINVAL, "unknown command"),
    (dict(cmd=nw.CMD_READ, length=512, flags=1 << 9), EINVAL, "unknown flag"),
    (dict(cmd=nw.CMD_READ, length=(64 << 20) + 512), EINVAL, "read over the maximum"),
    (dict(cmd=nw.CMD_READ, offset=2**64 - 512, length=1024), EINVAL, "read offset+length overflows"),
    (dict(cmd=nw.CMD_WRITE, offset=2**64 - 512, length=1024, payload=b"x" * 1024), ENOSPC,
     "write offset+length overflows"),
    (dict(cmd=nw.CMD_WRITE, offset=SIZE, length=512, payload=b"y" * 512), ENOSPC, "write past the end"),
    (dict(cmd=4, offset=SIZE - 512, length=1024), EINVAL, "trim past the end"),
]
for i, (req, want, what) in enumerate(cases):
    w.request(cookie=100 + i, **req)
    err, cookie, _ = w.simple_reply()
    assert cookie == 100 + i and err == want, f"{what}: error {err}, expected {want}"
w.request(nw.CMD_READ, 0, 512, cookie=200)          # the connection goes on
assert w.simple_reply(512)[0] == 0

# Bad magic: that connection ends.
w.s.sendall(b"\xde\xad\xbe\xef" + bytes(24))
try:
    w.simple_reply()
    raise AssertionError("server answered a request with a bad magic")
except (EOFError, ConnectionResetError, AssertionError) as e:
    if isinstance(e, AssertionError) and "bad magic" in str(e):
        raise
w.close()

# A write longer than the maximum: disconnected before its payload.
w = nw.Wire(srv.sock)
w.greeting()
w.go()
w.request(nw.CMD_WRITE, 0, (64 << 20) + 512, cookie=1)
try:
    w.simple_reply()
    raise AssertionError("server replied to a write over the maximum")
except (EOFError, ConnectionResetError):
    pass
w.close()

assert bystander.pread(4096, 0) == harness.pattern(SIZE, 5)[:4096], "bystander lost"
bystander.shutdown()
srv.stop()
assert harness.file_digest(image) == before, "file changed"
print(f"ok: {len(cases)} hostile requests refused, 2 connections dropped, others served")
