#!/usr/bin/python3
"""overlay=FILE (mloop-server --overlay) serves a copy-on-write device:
reads, writes of any alignment, zero, trim and BLOCK_STATUS show the base
with the device's writes on top, the base's bytes never change, and two
devices sharing one base see only their own writes.  The overlay keeps
every answered write across a SIGKILL and an orderly stop, and an overlay
that cannot be used (not one, made for another base, in use) is refused
at start with the reason.  Cost: about 3 s (20 s under valgrind)."""
import os
import random
import signal
import subprocess

import nbd

import harness

MIB = 1 << 20
# Not a multiple of the cluster: the base has a page-cache tail.
SIZE = 6 * MIB + 1000
BASE = harness.pattern(SIZE, 31)


def open_overlay(base, overlay, **kw):
    return harness.Server(base, [f"overlay={overlay}"], **kw)


def kill(srv):
    """SIGKILL, as the OOM killer would: no orderly stop."""
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    srv.logf.close()
    if os.path.exists(srv.sock):
        os.unlink(srv.sock)


def check_model(h, model, what):
    got = h.pread(len(model), 0)
    if got != bytes(model):
        first = next(i for i in range(len(model)) if got[i] != model[i])
        raise AssertionError(f"{what}: first wrong byte at {first}")


d = harness.tmpdir()
base = harness.make_image(SIZE, BASE)
digest = harness.file_digest(base)
ov1 = os.path.join(d, "one.overlay")
ov2 = os.path.join(d, "two.overlay")

srv1 = open_overlay(base, ov1)
srv2 = open_overlay(base, ov2)
h1 = srv1.connect(strict=False)
h2 = srv2.connect(strict=False)
assert h1.get_size() == SIZE, h1.get_size()
check_model(h1, BASE, "fresh overlay")

# Random writes, zeroes and trims of any alignment, mirrored in a model.
rng = random.Random(7)
model = bytearray(BASE)
for i in range(300):
    op = rng.choice(["write", "write", "write", "zero", "trim", "flush"])
    if rng.random() < 0.5:
        off = rng.randrange(0, SIZE // 4096) * 4096
        n = min(rng.choice([4096, 8192, 65536, 262144]), SIZE - off)
    else:
        off = rng.randrange(0, SIZE - 1)
        n = rng.randrange(1, min(20000, SIZE - off) + 1)
    if op == "write":
        data = bytes([rng.randrange(256)]) * n
        h1.pwrite(data, off)
        model[off:off + n] = data
    elif op in ("zero", "trim"):
        (h1.zero if op == "zero" else h1.trim)(n, off)
        model[off:off + n] = bytes(n)
    else:
        h1.flush()
check_model(h1, model, "after random IO")
# The last bytes, in the base's page-cache tail.
h1.pwrite(b"T" * 1000, SIZE - 1000)
model[SIZE - 1000:] = b"T" * 1000
check_model(h1, model, "after a write to the tail")
check_model(h2, BASE, "the other overlay of the same base")
h2.pwrite(b"2" * 4096, 0)
check_model(h1, model, "after a write through the other overlay")
assert harness.file_digest(base) == digest, "the base changed"

# nbdcopy (which follows BLOCK_STATUS) copies exactly the device.
copy = os.path.join(d, "copy.img")
subprocess.run(["nbdcopy", srv1.uri, copy], check=True)
with open(copy, "rb") as f:
    assert f.read() == bytes(model), "nbdcopy of the overlay differs"

# BLOCK_STATUS: a zeroed whole-cluster range is a hole that reads zeroes.
h3 = nbd.NBD()
h3.add_meta_context("base:allocation")
h3.connect_uri(srv1.uri)
h3.zero(MIB, 2 * MIB)
model[2 * MIB:3 * MIB] = bytes(MIB)
seen = []
h3.block_status(MIB, 2 * MIB,
                lambda meta, off, ents, err: seen.extend(ents))
assert seen[1] & 1 and seen[0] == MIB, f"zeroed range not a hole: {seen}"
h3.shutdown()

# A server killed with SIGKILL (the OOM killer) loses no answered write,
# flushed or not: the map's updates reach the kernel before the reply.
for i in range(40):
    off = rng.randrange(0, SIZE // 4096 - 1) * 4096
    h1.pwrite(b"U" * 4096, off)
    model[off:off + 4096] = b"U" * 4096
h1.flush()
for i in range(40):
    off = rng.randrange(0, SIZE // 4096 - 1) * 4096
    h1.pwrite(b"V" * 4096, off)
    model[off:off + 4096] = b"V" * 4096
kill(srv1)
srv1 = open_overlay(base, ov1)
h1 = srv1.connect(strict=False)
check_model(h1, model, "after SIGKILL")

# An orderly stop keeps even what was not flushed.
h1.pwrite(b"S" * 8192, 4096)
model[4096:4096 + 8192] = b"S" * 8192
h1.shutdown()
srv1.stop()
srv1 = open_overlay(base, ov1)
h1 = srv1.connect(strict=False)
check_model(h1, model, "after an orderly stop and a new start")

# Refusals, each with its reason.
def refused(image, overlay, want):
    try:
        srv = open_overlay(image, overlay)
    except RuntimeError as e:
        assert want in str(e), f"want {want!r} in: {e}"
        return
    srv.stop()
    raise AssertionError(f"started with {overlay}; wanted {want!r}")

refused(base, ov1, "in use by another server")
other = harness.make_image(SIZE + 4096, directory=d)
h1.shutdown()
srv1.stop()
refused(other, ov1, "was made for a base of")
refused(base, other, "is not an mloop overlay")
h2.shutdown()
srv2.stop()
assert harness.file_digest(base) == digest, "the base changed"
print("ok")
