#!/usr/bin/python3
"""Records the seed corpus of the fuzz targets (tests/fuzz/corpus) from
real clients talking to mloop-server: libnbd (nbdsh's Python binding,
nbdinfo), qemu (qemu-img, qemu-io) and nbd-client, plus hand-made
negotiations no client sends.  Not a test: run it by hand, from the top
of the tree after scripts/build, when the seeds need refreshing:

    /usr/bin/python3 tests/fuzz/record-seeds.py

A relay between each client and the server keeps what the client sent.
The negotiation (up to NBD_OPT_GO or NBD_OPT_EXPORT_NAME) becomes a
handshake seed, what follows it a request seed, each behind the byte(s)
choosing the export that the target reads first (see fuzz-*.c).
"""
import hashlib
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER = os.path.join(TOP, "build", "server", "mloop-server")
CORPUS = os.path.join(TOP, "tests", "fuzz", "corpus")
IHAVEOPT = 0x49484156454F5054
REQ_MAGIC = 0x25609513
IMAGE_SIZE = 4 << 20


class Relay:
    """A TCP listener that forwards one connection at a time to the
    server's Unix socket and keeps the bytes each client sent."""

    def __init__(self, target):
        self.target = target
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.streams = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            c, _ = self.sock.accept()
            s = socket.socket(socket.AF_UNIX)
            s.connect(self.target)
            sent = bytearray()
            self.streams.append(sent)
            threading.Thread(target=self._pump, args=(c, s, sent), daemon=True).start()
            threading.Thread(target=self._pump, args=(s, c, None), daemon=True).start()

    @staticmethod
    def _pump(src, dst, record):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if record is not None:
                    record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def take(self):
        """The streams recorded so far (after their connections ended)."""
        time.sleep(0.3)
        out = [bytes(s) for s in self.streams]
        self.streams.clear()
        return out


def split(stream):
    """(negotiation, transmission) of a client's stream to a server that
    accepts every name: the negotiation ends after GO or EXPORT_NAME."""
    pos = 4
    while pos + 16 <= len(stream):
        magic, opt, n = struct.unpack_from(">QII", stream, pos)
        if magic != IHAVEOPT:
            break
        pos += 16 + n
        if opt in (1, 7):   # EXPORT_NAME, GO
            return stream[:pos], stream[pos:]
    return stream, b""


def save(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    print(f"{target}/{name}: {len(data)} bytes")


def run(cmd, **kw):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30, **kw)
    return p.returncode, p.stdout.decode(errors="replace")


def main():
    if not os.path.exists(SERVER):
        sys.exit("build mloop-server first (scripts/build)")
    work = tempfile.mkdtemp(prefix="mloop-seeds-")
    image = os.path.join(work, "disk.img")
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE)
    sock = os.path.join(work, "nbd.sock")
    server = subprocess.Popen([SERVER, "--listen", f"unix:{sock}", image])
    try:
        while not os.path.exists(sock):
            time.sleep(0.05)
        relay = Relay(sock)
        url = f"nbd://127.0.0.1:{relay.port}/"
        # The bytes choosing the export (see fuzz-*.c): for the handshake,
        # any name and 1 MiB; for requests, read-write, discard on, a
        # 32 MiB limit and the image's size.
        hs_conf = b"\x02"
        rq_conf = b"\x02" + struct.pack(">Q", IMAGE_SIZE)
        clients = {
            "libnbd-rw": ["/usr/bin/python3", "-c", f"""
import nbd
h = nbd.NBD()
h.connect_uri("{url}")
h.pread(4096, 0)
h.pwrite(b"x" * 4096, 8192, nbd.CMD_FLAG_FUA)
h.pwrite(b"y" * 1000, 12288)
h.flush()
h.trim(65536, 1 << 20)
h.zero(65536, 2 << 20, nbd.CMD_FLAG_NO_HOLE)
h.zero(4096, 0, nbd.CMD_FLAG_FAST_ZERO)
h.shutdown()
"""],
            "nbdinfo": ["nbdinfo", url],
            "nbdinfo-list": ["nbdinfo", "--list", url],
            "qemu-img-info": ["qemu-img", "info", "-f", "raw", url],
            "qemu-io": ["qemu-io", "-f", "raw", "-c", "read 0 4k",
                        "-c", "write -P 0xab 4k 4k", "-c", "write -z 8k 64k",
                        "-c", "discard 64k 64k", "-c", "flush", url],
            "nbd-client-list": ["nbd-client", "-l", "127.0.0.1", str(relay.port)],
            "nbd-client": ["nbd-client", "-N", "", "127.0.0.1", str(relay.port),
                           "/dev/nbd15", "-b", "4096"],
        }
        for name, cmd in clients.items():
            if shutil.which(cmd[0]) is None:
                print(f"{name}: {cmd[0]} not installed, skipped")
                continue
            rc, out = run(cmd)
            streams = relay.take()
            if not streams:
                print(f"{name}: no connection ({out.strip()[:200]})")
                continue
            for i, s in enumerate(streams):
                suffix = f"-{i}" if len(streams) > 1 else ""
                hs, tx = split(s)
                save("handshake", name + suffix, hs_conf + hs)
                if len(tx) >= 28:
                    save("request", name + suffix, rq_conf + tx)
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)

    # Negotiations no client above sends.
    def opt(code, data=b"", n=None):
        return struct.pack(">QII", IHAVEOPT, code, len(data) if n is None else n) + data

    def go(name=b"", infos=(), code=7):
        return opt(code, struct.pack(">I", len(name)) + name +
                   struct.pack(">H", len(infos)) + b"".join(struct.pack(">H", i) for i in infos))

    named = b"\x01"    # the export is served as "disk" only
    hand = {
        "export-name-zeroes": named + struct.pack(">I", 1) + opt(1, b"disk"),
        "export-name-nozeroes": named + struct.pack(">I", 3) + opt(1, b"disk"),
        "export-name-wrong": named + struct.pack(">I", 3) + opt(1, b"other"),
        "go-wrong-then-right": named + struct.pack(">I", 3) + go(b"nope", (3,)) + go(b"disk", (0, 1, 2, 3)),
        "info-then-go": b"\x00" + struct.pack(">I", 3) + go(b"", (3,), code=6) + go(b""),
        "abort": b"\x00" + struct.pack(">I", 3) + opt(2),
        "unknown-options": b"\x00" + struct.pack(">I", 3) + opt(5) + opt(8) + opt(9, b"\0" * 8) + opt(0x7fffffff) + go(),
        "list-with-data": named + struct.pack(">I", 3) + opt(3, b"junk") + opt(3) + go(b"disk"),
        "too-big": b"\x00" + struct.pack(">I", 3) + opt(7, b"\0" * 5000) + go(),
        "export-name-long": named + struct.pack(">I", 3) + opt(1, b"d" * 4100),
        "export-name-too-big": named + struct.pack(">I", 3) + opt(1, b"d" * 5000),
        "hang-up": b"\x10" + struct.pack(">I", 3) + go(b"nope") + opt(3) + go(),
        "bad-client-flags": b"\x00" + struct.pack(">I", 4),
        "bad-option-magic": b"\x00" + struct.pack(">I", 3) + b"\0" * 16,
        "go-bad-lengths": b"\x00" + struct.pack(">I", 3) + opt(7, struct.pack(">I", 0xffffffff)) +
                          opt(7, struct.pack(">IH", 0, 5)) + go(),
    }
    for name, data in hand.items():
        save("handshake", name, data)

    def req(cmd, offset=0, length=0, flags=0, cookie=1, payload=b""):
        return struct.pack(">IHHQQI", REQ_MAGIC, flags, cmd, cookie, offset, length) + payload

    size = struct.pack(">Q", IMAGE_SIZE)
    hand = {
        "edges": b"\x02" + size + req(0, IMAGE_SIZE - 512, 512) + req(0, IMAGE_SIZE, 1) +
                 req(1, IMAGE_SIZE - 1, 2, payload=b"ab") + req(1, 0, 0) + req(0, 0, 0) +
                 req(0, 0xffffffffffffff00, 0x200) + req(4, 0, 0xffffffff) + req(6, 0, 4096, 0x13) +
                 req(3, 0, 0, 0x1) + req(7) + req(2),
        "read-only": b"\x01" + size + req(1, 0, 4, payload=b"abcd") + req(3) + req(4, 0, 512) + req(6, 0, 512) + req(0, 0, 512),
        "oversized": b"\x00" + size + req(0, 0, (32 << 20) + 1) + req(1, 0, (32 << 20) + 1),
        "bad-magic": b"\x02" + size + req(0, 0, 512)[:-28] + b"\x25\x60\x95\x14" + b"\0" * 24,
    }
    for name, data in hand.items():
        save("request", name, data)


main()
