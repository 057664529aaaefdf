#!/usr/bin/python3
"""Read replies sent by page reference never change after they are sent.

On a Unix socket mloop-server --splice on (what mloop attach runs for
the kernel's NBD client) sends a large READ's data by reference to its
buffer's pages (server/splice_out.h), so the socket holds those
pages until the client reads them, while the request's slot is free for
the next request.  Here the client sends a wave of 1 MiB reads and reads
no reply, so the replies fill the socket; then a second wave of reads
and writes that take the slots the first wave's sent replies freed (the
server's O_DIRECT reads and the writes' payloads land in those slots'
buffers); only then does it read every reply.  Each must hold the image's
bytes as they were: a buffer reused while the socket still held its
pages would show the second wave's data.  The server must also have a
pipe per connection, or it is not splicing; without --splice it must
have none.  Cost: about 2 s."""
import os
import socket
import time

import harness
import nbdwire as nw

MIB = 1 << 20
SIZE = 64 * MIB
WAVE = 16

data = harness.pattern(SIZE, 11)
image = harness.make_image(SIZE, data=data)


def pipe_ends(pid):
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("pipe:")
        except FileNotFoundError:
            pass                # closed since the listing
    return n


def server_pid(srv):
    with open(os.path.join(srv.dir, "server.pid")) as f:
        return int(f.read())


# Off by default: a connection gets no pipe (valgrind's own pipes aside).
srv = harness.Server(image)
before = pipe_ends(server_pid(srv))
h = srv.connect()
assert h.pread(1 << 20, 0) == data[:1 << 20]
assert pipe_ends(server_pid(srv)) == before, "a connection got a pipe without --splice on"
h.shutdown()
srv.stop()

srv = harness.Server(image, params=["splice=on"])
pid = server_pid(srv)

w = nw.Wire(srv.sock, timeout=30)
# Small, so the replies back up in the server's socket, not in ours.
w.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
w.greeting()
assert w.go()[-1][1] == nw.REP_ACK


# The handshake thread hands the connection to a worker a moment later.
deadline = time.monotonic() + 10
while pipe_ends(pid) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
assert pipe_ends(pid) >= 2, f"mloop-server holds {pipe_ends(pid)} pipe ends: not splicing"

expected = {}
for i in range(WAVE):                       # the first wave: reads
    w.request(nw.CMD_READ, i * MIB, MIB, cookie=i)
    expected[i] = data[i * MIB:(i + 1) * MIB]
time.sleep(1)                               # its replies fill the socket
new = harness.pattern(MIB, 12)
for i in range(WAVE, 2 * WAVE):             # the second: reads and writes
    off = (i + WAVE) * MIB
    if i % 2:
        w.request(nw.CMD_WRITE, off, MIB, cookie=i, payload=new)
        expected[i] = b""
    else:
        w.request(nw.CMD_READ, off, MIB, cookie=i)
        expected[i] = data[off:off + MIB]
for _ in range(2 * WAVE):
    error, cookie, _ = w.simple_reply()
    want = expected.pop(cookie)
    assert error == 0, f"request {cookie}: error {error}"
    got = w.recv_exact(len(want))
    assert got == want, f"request {cookie}: the reply's data changed " \
        f"after it was sent (first difference at byte " \
        f"{next(k for k in range(len(want)) if got[k] != want[k])})"
w.request(nw.CMD_READ, (WAVE + 1 + WAVE) * MIB, MIB, cookie=99)
error, cookie, got = w.simple_reply(MIB)
assert (error, cookie, got) == (0, 99, new), "a written MiB reads back wrong"
w.request(nw.CMD_DISC)
w.close()
srv.stop()
print(f"ok: {2 * WAVE} requests, every spliced reply as the image was")
