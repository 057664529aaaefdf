#!/usr/bin/python3
"""offset= and sizelimit= serve a window of the image, like losetup's
--offset and --sizelimit: the export is the window's size, reads and
writes land at the window's place in the file, trim, zero and extents
stay inside it, and nothing outside it ever changes.  An offset the
O_DIRECT alignment forbids, or one past the end of the file, is refused
at startup with the reason."""
import errno
import re
import nbd
import harness

MIB = 1 << 20
FILE_SIZE = 4 * MIB
OFF, LIMIT = 1 * MIB, 2 * MIB
ORIG = harness.pattern(FILE_SIZE, 13)


def read_file(path):
    with open(path, "rb") as f:
        return f.read()


def check_outside(path, what):
    """The bytes outside the window are the original ones."""
    now = read_file(path)
    assert len(now) == FILE_SIZE, f"{what}: file size changed to {len(now)}"
    assert now[:OFF] == ORIG[:OFF], f"{what}: bytes before the window changed"
    assert now[OFF + LIMIT:] == ORIG[OFF + LIMIT:], f"{what}: bytes after the window changed"
    return now[OFF:OFF + LIMIT]


def started(image, params):
    """A server for PARAMS that must run with O_DIRECT (skip if it can't)."""
    srv = harness.Server(image, params)
    if "O_DIRECT not supported" in srv.log_text():
        harness.skip("this filesystem refuses O_DIRECT")
    return srv


image = harness.make_image(FILE_SIZE, data=ORIG)
srv = started(image, [f"offset={OFF}", f"sizelimit={LIMIT}"])
h = srv.connect(strict=False)
mirror = bytearray(ORIG[OFF:OFF + LIMIT])

# Size and reads.
assert h.get_size() == LIMIT, f"export size {h.get_size()}, expected {LIMIT}"
assert h.pread(LIMIT, 0) == bytes(mirror), "window reads differ from the file at +1 MiB"
assert h.pread(4096, LIMIT - 4096) == bytes(mirror[-4096:])
harness.expect_error(errno.EINVAL, h.pread, 512, LIMIT)
harness.expect_error(errno.EINVAL, h.pread, 1024, LIMIT - 512)

# Writes: aligned, unaligned, at both ends of the window.
for off, n in [(0, 4096), (LIMIT - 4096, 4096), (5, 1000), (LIMIT - 700, 700),
               (MIB - 100, 300), (0, 1)]:
    data = harness.pattern(n, off + 1)
    h.pwrite(data, off)
    mirror[off:off + n] = data
for off, n in [(LIMIT - 512, 1024), (LIMIT, 512)]:
    harness.expect_error(errno.ENOSPC, h.pwrite, b"x" * n, off)
h.flush()
assert h.pread(LIMIT, 0) == bytes(mirror)
assert check_outside(image, "writes") == bytes(mirror), "writes did not land at +1 MiB"

# Trim and zero, aligned and not, up to the window's last byte.
if h.can_trim():
    for off, n in [(64 << 10, 128 << 10), (LIMIT - (64 << 10), 64 << 10)]:
        h.trim(n, off)
        mirror[off:off + n] = bytes(n)
for off, n, flags in [(300 << 10, 64 << 10, 0), (777, 5000, 0),
                      (LIMIT - 3000, 3000, nbd.CMD_FLAG_NO_HOLE),
                      (LIMIT - (256 << 10), 256 << 10, 0)]:
    h.zero(n, off, flags=flags)
    mirror[off:off + n] = bytes(n)
harness.expect_error(errno.ENOSPC, h.zero, 1024, LIMIT - 512)
h.flush()
assert h.pread(LIMIT, 0) == bytes(mirror)
assert check_outside(image, "trim/zero") == bytes(mirror), "trim/zero missed their place"

h.shutdown()

# Extents (both servers answer BLOCK_STATUS): whole extents inside the
# window, holes only where the window reads as zeroes.

h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(srv.uri)
harness.on_exit(lambda: harness._disconnect(h))
extents = 0
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION), "base:allocation not offered"
pos = 0
while pos < LIMIT:
    got = []
    h.block_status(LIMIT - pos, pos,
                   lambda ctx, off, entries, err: got.extend(entries))
    for i in range(0, len(got), 2):
        length, flags = got[i], got[i + 1]
        if pos >= LIMIT:
            break
        assert pos + length <= LIMIT, f"extent {pos}+{length} reaches past the window"
        if flags & nbd.STATE_HOLE:
            assert bytes(mirror[pos:pos + length]) == bytes(length), \
                f"hole reported at {pos}+{length} over data"
        pos += length
        extents += 1
assert pos == LIMIT
h.shutdown()
srv.stop()
assert check_outside(image, "end") == bytes(mirror)

# The window of an odd-sized file that reaches its end: the tail is the
# file's, the export ends with the file.
odd = harness.make_image(FILE_SIZE + 100, data=ORIG + harness.pattern(100, 3))
srv = started(odd, [f"offset={OFF}"])
h = srv.connect(strict=False)
size = FILE_SIZE + 100 - OFF
assert h.get_size() == size
h.pwrite(b"T" * 300, size - 300)
h.flush()
h.shutdown()
srv.stop()
got = read_file(odd)
assert len(got) == FILE_SIZE + 100 and got[-300:] == b"T" * 300
assert got[:FILE_SIZE - 200] == ORIG[:FILE_SIZE - 200]

# A size limit ending inside a block: rounded down to it with O_DIRECT.
srv = started(image, [f"offset={OFF}", f"sizelimit={MIB + 100}", "direct=on"])
h = srv.connect()
assert h.get_size() == MIB, f"sizelimit {MIB + 100} served as {h.get_size()}"
h.shutdown()
srv.stop()

# Refused at startup, with the reason.
for params, pattern in [
        (["offset=1000", "direct=on"],
         r"offset 1000 is not a multiple of the image's \d+-byte O_DIRECT alignment"),
        ([f"offset={FILE_SIZE}"], rf"offset {FILE_SIZE} is not inside the image"),
        ([f"offset={FILE_SIZE + MIB}"], r"is not inside the image"),
        (["sizelimit=100", "direct=on"], r"sizelimit 100 is below the image's \d+-byte"),
        (["offset=12Q"], r"offset=12Q|--offset=12Q")]:
    try:
        s = harness.Server(image, params)
    except RuntimeError as e:
        assert re.search(pattern, str(e)), f"{params}: expected /{pattern}/ in: {e}"
        continue
    s.stop()
    raise AssertionError(f"{params}: the server started")
before = read_file(image)
assert check_outside(image, "refusals") == bytes(mirror) and len(before) == FILE_SIZE
print(f"ok: 2 MiB window at +1 MiB: reads, writes, trim, zero, {extents} extents "
      "stay inside it; odd tail; bad offsets refused")
