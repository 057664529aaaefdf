"""mloop attach --offset --sizelimit attaches a window of the image, like
losetup: the device is the window's size, what is written through it with
O_DIRECT lands at the window's place in the file and nowhere else, and
list --json and status show the window.  A second window of the same
file that does not overlap may be attached alongside; an overlapping one
is refused.  --offset 1000 (not a multiple of the O_DIRECT alignment) is
refused with the reason, leaving nothing behind."""
import json
import mmap
import os
import stat

import blockio
from kfix import make_image, nbd_in_use, processes_mentioning, run, sysfs, tmpdir

MIB = 1 << 20
FILE_SIZE = 16 * MIB
A_OFF, A_SIZE = 4 * MIB, 8 * MIB       # the window written through
B_OFF, B_SIZE = 12 * MIB, 4 * MIB      # its neighbour, right after it


def file_bytes(path, offset, length):
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def read_direct(dev, length):
    """LENGTH bytes from the start of DEV, with O_DIRECT."""
    buf = mmap.mmap(-1, length)
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fd, [buf], 0) == length
        return bytes(buf)
    finally:
        os.close(fd)
        buf.close()


def refused(kind, args, words):
    """mloop ARGS fails with one line holding every one of WORDS and
    leaves no state, device or server behind; returns the line."""
    state = kind.state_entries()
    busy = sorted(d for d in os.listdir("/sys/block") if d.startswith("nbd")
                  and nbd_in_use(f"/dev/{d}"))
    p = kind.cli(*args, check=False)
    lines = p.stderr.splitlines()
    assert p.returncode != 0, f"mloop {' '.join(args)} succeeded"
    assert len(lines) == 1, f"expected one line on stderr, got {p.stderr!r}"
    for w in words:
        assert w in lines[0], f"{w!r} not in {lines[0]!r}"
    assert p.stdout == "", f"printed {p.stdout!r}"
    assert kind.state_entries() == state, f"left state: {kind.state_entries()}"
    now = sorted(d for d in os.listdir("/sys/block") if d.startswith("nbd")
                 and nbd_in_use(f"/dev/{d}"))
    assert now == busy, f"left devices connected: {sorted(set(now) - set(busy))}"
    return lines[0]


def window_args(kind, image, offset, size):
    return kind.attach_args(image) + ["--offset", str(offset), "--sizelimit", str(size)]


def run_test(kind, cl):
    image = make_image(cl, size=FILE_SIZE, fill=FILE_SIZE, seed=7)
    orig = file_bytes(image, 0, FILE_SIZE)

    # Refused before anything starts, or by the server at start.
    line = refused(kind, kind.attach_args(image) + ["--offset", "1000"],
                   ["1000", "is not a multiple of", "O_DIRECT alignment"])
    refused(kind, kind.attach_args(image) + ["--offset", str(FILE_SIZE)],
            ["is not inside the image"])
    assert not processes_mentioning(image), "a refused attach left a server"

    a = kind.attach(cl, image, args=window_args(kind, image, A_OFF, A_SIZE))
    assert int(sysfs(a.device, "size")) * 512 == A_SIZE, \
        f"{a.device} is {sysfs(a.device, 'size')} sectors, expected {A_SIZE // 512}"
    # The neighbour fits; overlapping windows and the whole file do not.
    b = kind.attach(cl, image, args=window_args(kind, image, B_OFF, B_SIZE))
    refused(kind, window_args(kind, image, B_OFF - MIB, 2 * MIB),
            ["already attached to " + a.device, "must not overlap"])
    refused(kind, kind.attach_args(image), ["already attached to"])

    entries = {e["device"]: e for e in json.loads(kind.cli("list", "--json").stdout)}
    for att, off, size in ((a, A_OFF, A_SIZE), (b, B_OFF, B_SIZE)):
        e = entries[att.device]
        assert (e["offset"], e["sizelimit"], e["size"]) == (off, size, size), \
            f"list --json for {att.device}: {e}"
    status = kind.cli("status", a.device).stdout
    assert f"offset {A_OFF}, sizelimit {A_SIZE}" in status, f"status: {status}"

    assert read_direct(a.device, A_SIZE) == orig[A_OFF:A_OFF + A_SIZE], \
        "the window does not read the file's bytes at its offset"
    assert read_direct(b.device, B_SIZE) == orig[B_OFF:B_OFF + B_SIZE]
    blockio.fill(a.device, 0, A_SIZE)
    a.detach()
    b.detach()

    want = b"".join(blockio.pattern(off, 0) for off in range(0, A_SIZE, blockio.BLOCK))
    assert file_bytes(image, A_OFF, A_SIZE) == want, \
        "what was written through the window is not at its offset in the file"
    assert file_bytes(image, 0, A_OFF) == orig[:A_OFF], "bytes before the window changed"
    assert file_bytes(image, A_OFF + A_SIZE, FILE_SIZE) == orig[A_OFF + A_SIZE:], \
        "bytes after the window changed"
    assert os.path.getsize(image) == FILE_SIZE
    # A TAP diagnostic: the runner's stdout is the suite's TAP stream.
    print(f"# offset-window: {A_SIZE >> 20} MiB window at +{A_OFF >> 20} MiB written "
          f"in place, neighbour attached alongside; refused: {line}", flush=True)
    one_disk_two_nodes(kind, cl)


def one_disk_two_nodes(kind, cl):
    """A loop device attached through its /dev node, then through a
    second node of the same device number: refused, whole or a window."""
    image = make_image(cl, size=FILE_SIZE, seed=8)
    loop = run(["losetup", "--find", "--show", image]).stdout.strip()
    cl.push(run, ["losetup", "-d", loop])
    st = os.stat(loop)
    other = os.path.join(tmpdir(cl), "disk")
    os.mknod(other, 0o600 | stat.S_IFBLK, st.st_rdev)
    a = kind.attach(cl, loop)
    line = refused(kind, kind.attach_args(other), ["already attached to " + a.device])
    refused(kind, window_args(kind, other, 0, MIB), ["already attached to " + a.device])
    # Found by either node, as it is refused by either.
    found = kind.status(other)["device"]
    assert found["device"] == a.device, f"status of {other}: {found}"
    a.detach()
    print(f"# offset-window: {loop} attached, its second node refused: {line}",
          flush=True)
