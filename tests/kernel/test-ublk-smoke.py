"""Throwaway smoke test of the ublk prototype (issue 15; not in runner.py's
lists, run it with MLOOP_KERNEL_TESTS=ublk-smoke on the 6.12 kernel).

mloop-ublk serves an image as /dev/ublkbN: the device has the image's
size and bytes, a pattern written with O_DIRECT reads back and lands in
the image at the same offset, DISCARD and WRITE_ZEROES (blkdiscard, -z)
read back as zeroes there and in the image (the discard as a hole), and
SIGTERM removes the device.  Done once
with the ioctl-encoded command numbers and once with the legacy ones, to
record which the kernel takes."""
import os
import select
import signal
import subprocess

from kfix import Cleanup, Skip, make_image, run, tmpdir, wait_until  # noqa: F401

SIZE = 64 << 20
PATTERN_OFF = 8 << 20
PATTERN_LEN = 4 << 20
# Inside the pattern: discarded, then zeroed (1 MiB each).
DISCARD_OFF = PATTERN_OFF + (1 << 20)
ZERO_OFF = PATTERN_OFF + (2 << 20)
MIB = 1 << 20


def ublk_bin():
    path = os.environ.get("MLOOP_UBLK_BIN")
    if not path and os.environ.get("MLOOP_CLI"):
        build = os.path.dirname(os.path.dirname(os.environ["MLOOP_CLI"]))
        path = os.path.join(build, "ublk", "mloop-ublk")
    if not path or not os.access(path, os.X_OK):
        raise Skip("no mloop-ublk (MLOOP_UBLK_BIN, or ublk/ next to MLOOP_CLI's build)")
    return path


def start(cl, image, extra=()):
    """Starts mloop-ublk; returns (process, device) once it printed it."""
    p = subprocess.Popen([ublk_bin(), *extra, image], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)

    def stop():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise AssertionError("mloop-ublk ignored SIGTERM for 30 s")
        err = p.stderr.read()
        for line in err.splitlines():
            print(f"# {' '.join(extra) or 'encoded opcodes'}: {line}", flush=True)
        assert rc == 0, f"mloop-ublk exit {rc}: {err.strip()}"
    cl.push(stop)
    ready, _, _ = select.select([p.stdout], [], [], 30)
    line = p.stdout.readline().strip() if ready else ""
    if not line:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        cl.actions.pop()
        raise AssertionError(f"mloop-ublk {' '.join(extra)} printed no device: "
                             f"{p.stderr.read().strip()}")
    wait_until(lambda: os.path.exists(line), f"{line} to appear")
    return p, line


def read_dev(dev, off, length):
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        import mmap
        buf = mmap.mmap(-1, length)
        n = os.preadv(fd, [buf], off)
        assert n == length, f"short read {n} of {length} from {dev}"
        return bytes(buf)
    finally:
        os.close(fd)


def run_test(kind, cl):
    if not os.path.exists("/dev/ublk-control"):
        raise Skip("no /dev/ublk-control (ublk_drv: Linux 6.12 kernel tests only)")
    image = make_image(cl, size=SIZE, fill=1 << 20, seed=7)
    with open(image, "rb") as f:
        head = f.read(1 << 20)
    pattern = os.urandom(PATTERN_LEN)
    pfile = os.path.join(tmpdir(cl), "pattern")
    with open(pfile, "wb") as f:
        f.write(pattern)

    p, dev = start(cl, image)
    size = int(run(["blockdev", "--getsize64", dev]).stdout)
    assert size == SIZE, f"{dev} has {size} bytes, the image {SIZE}"
    assert read_dev(dev, 0, 1 << 20) == head, f"{dev} reads other bytes than the image"
    run(["dd", f"if={pfile}", f"of={dev}", "bs=1M", f"seek={PATTERN_OFF >> 20}",
         "oflag=direct", "conv=fsync,notrunc", "status=none"])
    assert read_dev(dev, PATTERN_OFF, PATTERN_LEN) == pattern, "pattern reads back wrong"
    name = os.path.basename(dev)
    with open(f"/sys/block/{name}/queue/discard_max_bytes") as f:
        assert int(f.read()) > 0, f"{dev} offers no discard"
    run(["blkdiscard", "-o", str(DISCARD_OFF), "-l", str(MIB), dev])
    run(["blkdiscard", "-z", "-o", str(ZERO_OFF), "-l", str(MIB), dev])
    expect = bytearray(pattern)
    expect[DISCARD_OFF - PATTERN_OFF:ZERO_OFF - PATTERN_OFF + MIB] = bytes(2 * MIB)
    expect = bytes(expect)
    assert read_dev(dev, PATTERN_OFF, PATTERN_LEN) == expect, \
        "discarded/zeroed range does not read back as zeroes"
    # Stop the server (the cleanup action checks its exit) and look at the image.
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    wait_until(lambda: not os.path.exists(dev), f"{dev} to go away")
    with open(image, "rb") as f:
        f.seek(PATTERN_OFF)
        assert f.read(PATTERN_LEN) == expect, "the image lacks the pattern written and zeroed"
        # The engine punches the discarded range out of the file.
        hole = os.lseek(f.fileno(), PATTERN_OFF, os.SEEK_HOLE)
        assert hole == DISCARD_OFF, f"no hole where discarded: first hole at {hole}"
        f.seek(0)
        assert f.read(1 << 20) == head, "the image's head changed"

    # The legacy (bare) command numbers: Debian's 6.12 still has
    # CONFIG_BLKDEV_UBLK_LEGACY_OPCODES; say which way it went.
    try:
        _, dev = start(cl, image, ["--legacy-opcodes"])
    except AssertionError as e:
        print(f"# ublk-smoke: legacy opcodes refused: {e}", flush=True)
    else:
        assert read_dev(dev, PATTERN_OFF, PATTERN_LEN) == expect, \
            "pattern reads back wrong with legacy opcodes"
        print("# ublk-smoke: legacy opcodes work too", flush=True)
