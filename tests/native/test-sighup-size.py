#!/usr/bin/python3
"""SIGHUP makes mloop-server serve its image's new size (mloop resize).
After the image grows, a write past the old end is refused (ENOSPC) until
SIGHUP, then accepted on the connection that was already open, and a new
connection is offered the new size; after the image shrinks and SIGHUP, a
read past the new end is refused (EINVAL) and a new connection sees the
smaller size.  An unaligned new size advertises a minimum block size of 1
and its last byte is served.  The server logs each new size and stays up."""
import errno
import os
import signal
import time

import nbd

import harness
import netserver

MIB = 1 << 20


def hup(srv, size):
    """SIGHUP, then waits until the server says it serves SIZE bytes."""
    want = f"SIGHUP: serving {size} bytes"
    before = srv.log_text().count(want)
    os.kill(srv.pid, signal.SIGHUP)
    deadline = time.monotonic() + 10
    while srv.log_text().count(want) == before:
        assert time.monotonic() < deadline, f"no {want!r} in: {srv.log_text()}"
        time.sleep(0.01)


def loose(h):
    """Lets libnbd send requests past the size it negotiated: the server,
    not the client, must decide."""
    h.set_strict_mode(0)
    return h


image = harness.make_image(1 * MIB)
srv = netserver.NetServer(image, unix=True)
h = loose(srv.connect())
assert h.get_size() == MIB

# Grown: refused before SIGHUP, served after, on the same connection.
os.truncate(image, 2 * MIB)
harness.expect_error(errno.ENOSPC, h.pwrite, b"g" * 4096, 2 * MIB - 4096)
hup(srv, 2 * MIB)
h.pwrite(b"g" * 4096, 2 * MIB - 4096)
assert h.pread(4096, 2 * MIB - 4096) == b"g" * 4096
with open(image, "rb") as f:
    f.seek(2 * MIB - 4096)
    assert f.read(4096) == b"g" * 4096, "the write past the old end is not in the image"
h2 = srv.connect()
assert h2.get_size() == 2 * MIB, h2.get_size()

# Shrunk: reads past the new end are refused, new connections see it.
os.truncate(image, MIB)
hup(srv, MIB)
harness.expect_error(errno.EINVAL, h.pread, 4096, 2 * MIB - 4096)
assert srv.connect().get_size() == MIB

# Unaligned: minimum block 1, and the last byte is served.
os.truncate(image, MIB + 1)
hup(srv, MIB + 1)
h3 = srv.connect()
assert h3.get_size() == MIB + 1
assert h3.get_block_size(nbd.SIZE_MINIMUM) == 1, h3.get_block_size(nbd.SIZE_MINIMUM)
h3.pwrite(b"z", MIB)
assert h3.pread(1, MIB) == b"z"
assert srv.alive(), srv.log_text()
for c in (h, h2, h3):
    c.shutdown()
