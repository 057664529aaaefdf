"""A disk that drops writes between two flushes: silent loss nothing above
the disk can see.

Pattern A is written to a region of the attached device and flushed
(fsync); then the table under the image becomes dm-flakey with
drop_writes (writes are thrown away and reported done, reads work), and
pattern B is written over the region with O_DIRECT and flushed; the region
is read back (O_DIRECT), the table is made linear again, and the region is
read back once more.

The test records what the client saw and asserts the behaviour documented
for it: the writes and the flush of B succeed, and both reads return A,
not B.  No server can detect the loss (the disk said every write was done),
so mloop's kinds behave like loop: the device reports success and the data
is silently old.  If that changes (an error, or B reading back), the test
fails, naming what changed.  For the mloop kinds `mloop status` counts no
error and the supervisor did not restart the server.
"""
import mmap
import os
import struct

import dmtarget
import kinds

BLOCK = 4096
DISK_SIZE = 32 << 20
REGION_OFFSET = 4 << 20
REGION = 1 << 20
BLOCKS = REGION // BLOCK
# B is written in pieces of these many blocks (single blocks and one large
# write), so both small and merged-size requests are dropped.
PIECES = [1] * 16 + [BLOCKS - 16]


def pattern(name, offset):
    """A 4 KiB block naming the pattern and its offset."""
    return (name.encode() + struct.pack("<Q", offset) + bytes(7)) * (BLOCK // 16)


def region(name):
    return b"".join(pattern(name, REGION_OFFSET + i * BLOCK) for i in range(BLOCKS))


def write_region(dev, data):
    """Writes DATA over the region with O_DIRECT, in PIECES, then fsyncs;
    returns [(what, error or None)] in order."""
    outcome = []
    buf = mmap.mmap(-1, REGION)
    buf.write(data)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        at = 0
        for n in PIECES:
            what = f"write {n * BLOCK} at {REGION_OFFSET + at * BLOCK}"
            try:
                done = os.pwrite(fd, memoryview(buf)[at * BLOCK:(at + n) * BLOCK],
                                 REGION_OFFSET + at * BLOCK)
                outcome.append((what, None if done == n * BLOCK else f"{done} bytes"))
            except OSError as e:
                outcome.append((what, os.strerror(e.errno)))
            at += n
        try:
            os.fsync(fd)
            outcome.append(("fsync", None))
        except OSError as e:
            outcome.append(("fsync", os.strerror(e.errno)))
    finally:
        os.close(fd)
        buf.close()
    return outcome


def read_region(dev):
    """Reads the region with O_DIRECT; returns (count of blocks holding A,
    of B, of anything else), or the error as a string."""
    buf = mmap.mmap(-1, REGION)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        try:
            done = os.preadv(fd, [buf], REGION_OFFSET)
        except OSError as e:
            return os.strerror(e.errno)
        if done != REGION:
            return f"short read: {done} bytes"
        counts = [0, 0, 0]
        for i in range(BLOCKS):
            block = buf[i * BLOCK:(i + 1) * BLOCK]
            off = REGION_OFFSET + i * BLOCK
            counts[0 if block == pattern("A", off) else 1 if block == pattern("B", off) else 2] += 1
        return tuple(counts)
    finally:
        os.close(fd)
        buf.close()


def describe(res):
    return res if isinstance(res, str) else f"A {res[0]}, B {res[1]}, other {res[2]}"


def run_test(kind, cl):
    dmtarget.load("flakey")
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "flakey", dmtarget.linear(disk))
    dev = kind.attach(cl, dm.path).device
    cli = isinstance(kind, kinds.MloopCli)
    if cli:
        before = kind.status(dev)

    wrote_a = write_region(dev, region("A"))
    assert all(err is None for _, err in wrote_a), f"writing A failed: {wrote_a}"
    assert read_region(dev) == (BLOCKS, 0, 0), f"A reads back as {describe(read_region(dev))}"

    if cli:
        mid = kind.status(dev)
    dm.swap(dmtarget.flakey(disk, "drop_writes"))
    wrote_b = write_region(dev, region("B"))
    dropped = read_region(dev)
    dm.swap(dmtarget.linear(disk))
    recovered = read_region(dev)

    failed = [f"{what}: {err}" for what, err in wrote_b if err]
    writes_ok = sum(err is None for _, err in wrote_b[:-1])
    summary = (f"{kind.name}: writes of B {writes_ok}/{len(wrote_b) - 1} ok, "
               f"fsync {wrote_b[-1][1] or 'ok'}; read while dropping: {describe(dropped)}; "
               f"after recovery: {describe(recovered)}")
    if cli:
        after = kind.status(dev)
        errors = after["errors"] - before["errors"]
        flushes = after["requests"]["flush"] - mid["requests"]["flush"]
        summary += (f"; the server answered {flushes} flushes (of B) ok, "
                    f"mloop status errors {errors}, restarts {after['restarts']}")
    print(f"# dropped-writes: {summary}", flush=True)

    # The documented behaviour: success reported, and the old data stays.
    assert not failed, f"the client now sees the dropped writes fail: {failed}"
    expected = (BLOCKS, 0, 0)
    assert dropped == expected, \
        f"read while dropping writes: {describe(dropped)}, expected all A (silently old)"
    assert recovered == expected, \
        f"read after recovery: {describe(recovered)}, expected all A (silently old)"
    if cli:
        assert errors == 0, f"mloop status counts {errors} errors for dropped writes"
        # The fsync of B reached the server, and it said the data was safe.
        assert flushes >= 1, "the fsync of B sent no flush to the server"
        kind.assert_same_server(dev, before, after)
