#!/usr/bin/python3
"""Export names over TCP, by the protocol.  With --export-name disk: GO
and INFO for another name (the empty name and a 4096-byte one included)
get NBD_REP_ERR_UNKNOWN and negotiation goes on to a GO for "disk" that
works; EXPORT_NAME with another name closes the connection without a
reply, with "disk" starts transmission; LIST lists "disk" only; libnbd
connects as "disk" and is refused as anything else.  Without it, the empty
name (the default export) and a 4096-byte name are served.  Either way a
4097-byte name is NBD_REP_ERR_INVALID, a name length field of 0xffffffff
in a short option is NBD_REP_ERR_INVALID without reading on, an option
length of 0xffffffff closes the connection at once, with nothing read or
allocated; and the server serves the next client.  --export-name itself
takes 4096 bytes and refuses 4097 or non-UTF-8 in one line."""
import struct
import subprocess

import harness
import netserver
import nbdwire as nw
import nbd

image = harness.make_image(1 << 20, data=b"hello")


def connect(srv):
    w = nw.Wire(srv.addr)
    harness.on_exit(w.close)
    w.greeting()
    return w


def info(w, name):
    w.option(nw.OPT_INFO, struct.pack(">I", len(name)) + name + struct.pack(">H", 0))
    replies = []
    while True:
        r = w.reply()
        replies.append(r)
        if r[1] != nw.REP_INFO:
            return replies


def serves(w):
    """In transmission: the first bytes read back."""
    w.request(nw.CMD_READ, 0, 512, cookie=9)
    err, cookie, data = w.simple_reply(512)
    assert err == 0 and cookie == 9 and data[:5] == b"hello", (err, cookie, data[:5])


def closed(w, what):
    """The server closes W promptly, sending nothing."""
    w.s.settimeout(5)
    try:
        data = w.s.recv(1)
    except ConnectionResetError:
        data = b""
    assert data == b"", f"{what}: the server sent {data!r} instead of closing"


def listing(w):
    w.option(nw.OPT_LIST)
    names = []
    while True:
        opt, rtype, data = w.reply()
        if rtype == nw.REP_ACK:
            return names
        assert rtype == nw.REP_SERVER, f"LIST reply {rtype:#x}"
        (n,) = struct.unpack(">I", data[:4])
        names.append(data[4:4 + n])


def hostile_lengths(srv, expect_ok):
    """4097-byte name, name length 0xffffffff, option length 0xffffffff."""
    w = connect(srv)
    assert w.go(name=b"x" * 4097)[-1][1] == nw.REP_ERR_INVALID
    # Claimed name longer than the option: refused from the option alone.
    w.option(nw.OPT_GO, struct.pack(">IH", 0xFFFFFFFF, 0))
    assert w.reply()[1] == nw.REP_ERR_INVALID
    w.option(nw.OPT_INFO, struct.pack(">I", 0xFFFFFFFF) + b"disk" + struct.pack(">H", 0))
    assert w.reply()[1] == nw.REP_ERR_INVALID
    # Negotiation went on through all of that.
    assert w.go(name=expect_ok)[-1][1] == nw.REP_ACK
    serves(w)
    w.close()

    rss0 = srv.status_kib("VmRSS")
    for opt in (nw.OPT_GO, nw.OPT_EXPORT_NAME):
        w = connect(srv)
        w.option(opt, b"\0" * 16, declared_len=0xFFFFFFFF)
        t = netserver.wait_eof(w.s, 5)
        assert t < 2, f"took {t:.1f} s to close a 4 GiB option"
        w.close()
    assert srv.status_kib("VmRSS") - rss0 < 4096, "the server grew by MiBs"


# ---- --export-name disk
srv = netserver.NetServer(image, ["--export-name", "disk"])
w = connect(srv)
for name in (b"", b"x" * 4096, b"Disk", b"disk\0"):
    last = w.go(name=name)[-1]
    assert last[1] == nw.REP_ERR_UNKNOWN, f"GO {name[:8]!r}: {last[1]:#x}"
    assert info(w, name)[-1][1] == nw.REP_ERR_UNKNOWN
assert listing(w) == [b"disk"]
infos = info(w, b"disk")
assert infos[-1][1] == nw.REP_ACK and infos[0][1] == nw.REP_INFO
assert w.go(name=b"disk")[-1][1] == nw.REP_ACK
serves(w)
w.close()

# EXPORT_NAME: another name (or none) closes, "disk" gets size and flags.
for name in (b"", b"other", b"x" * 4096):
    w = connect(srv)
    w.option(nw.OPT_EXPORT_NAME, name)
    closed(w, f"EXPORT_NAME {name[:8]!r}")
    w.close()
w = connect(srv)
w.option(nw.OPT_EXPORT_NAME, b"disk")
size, flags = struct.unpack(">QH", w.recv_exact(10))
assert size == 1 << 20, size
serves(w)
w.close()

hostile_lengths(srv, b"disk")

# libnbd: as "disk" it works, as anything else it is refused.
h = srv.connect(name="disk")
assert h.pread(512, 0)[:5] == b"hello"
h.shutdown()
for name in ("", "other"):
    try:
        srv.connect(name=name)
        raise AssertionError(f"libnbd connected as {name!r}")
    except nbd.Error as e:
        assert "unknown" in str(e).lower() or "export" in str(e).lower(), str(e)
assert srv.alive()
srv.stop()

# ---- no --export-name: any name, "" is the default export.
srv = netserver.NetServer(image)
w = connect(srv)
assert listing(w) == [b""]
assert info(w, b"x" * 4096)[-1][1] == nw.REP_ACK
assert w.go(name=b"")[-1][1] == nw.REP_ACK
serves(w)
w.close()
w = connect(srv)
assert w.go(name=b"x" * 4096)[-1][1] == nw.REP_ACK
serves(w)
w.close()
hostile_lengths(srv, b"")
h = srv.connect(name="anything")
assert h.pread(512, 0)[:5] == b"hello"
h.shutdown()
srv.stop()

# ---- a 4096-byte --export-name is served; 4097 bytes or bad UTF-8 refused.
long_name = "n" * 4096
srv = netserver.NetServer(image, ["--export-name", long_name])
w = connect(srv)
assert listing(w) == [long_name.encode()]
assert w.go(name=b"n" * 4095)[-1][1] == nw.REP_ERR_UNKNOWN
assert w.go(name=long_name.encode())[-1][1] == nw.REP_ACK
serves(w)
w.close()
srv.stop()
for bad in [b"n" * 4097, b"\xff\xfe"]:
    p = subprocess.run([harness.SERVER_BIN, "--listen", "tcp:127.0.0.1:1", "--export-name", bad, image],
                       capture_output=True, text=True, timeout=10)
    lines = p.stderr.strip().splitlines()
    # glib's option parser refuses bytes invalid in the locale itself.
    assert p.returncode == 1 and len(lines) == 1 and (
        "--export-name" in lines[0] or "Invalid byte sequence" in lines[0]), p.stderr
print("ok: export names by the protocol, with and without --export-name; hostile lengths refused")
