"""Smoke test of mloop-ublk (runner.py's UBLK list: the mloop-ublk kind,
on the 6.12 kernel, the one with ublk_drv).

mloop-ublk is started the way `mloop attach --transport ublk` starts it
(stdin /dev/null, stdout and stderr into a log, --device-file and
--pid-file, success = the pid file appears) and serves an image as
/dev/ublkbN: the device file names the device and the pid file its
server; the device has the image's size and bytes, a pattern written
with O_DIRECT reads back and lands in the image at the same offset,
DISCARD and WRITE_ZEROES (blkdiscard, -z) read back as zeroes there and
in the image (the discard as a hole), and SIGTERM exits 0 leaving no
/dev/ublkb*, no /sys/class/ublk-char/* behind.  A SIGKILLed server's
device is removed by `mloop-ublk --delete N`.  A bad option and a
missing image fail in one line, exit 1, nothing left behind.  An
odd-sized image is served to its last whole sector, with a warning; a
window (--offset, --sizelimit) and --read-only reach the device; a
full fs.aio-max-nr refuses in one line or serves at a smaller depth.
The legacy (bare) command numbers are tried once, to record which the
kernel takes.

User recovery: a --recovery server SIGKILLed with a write in flight
leaves /dev/ublkbN, IO held (a read issued then blocks); `--recover N`
takes it over, the held write and read complete without error, the data
written before and during the kill is on the device and in the image,
the counters file goes on; killed again and recovered again it still
serves; SIGTERM then removes it.  --recover refuses, in one line with
exit 1 and the device untouched, a missing id, a device added without
--recovery, an image of another size, other --queues, too little AIO
room for the device's depth; one failing after END_USER_RECOVERY (its
--device-file) leaves the device to a next --recover; `--delete N`
removes a quiesced device."""
import struct
import glob
import os
import signal
import subprocess
import time

from kfix import Skip, make_image, run, tmpdir, wait_until

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


def leftovers():
    """ublk block and character devices present now."""
    return sorted(glob.glob("/dev/ublkb*") + glob.glob("/sys/class/ublk-char/*"))


def log_of(path):
    with open(path) as f:
        return f.read()


class Server:
    """An mloop-ublk started as `mloop attach` starts it."""

    def __init__(self, cl, image, extra=(), env=None):
        d = tmpdir(cl)
        self.log = os.path.join(d, "log")
        self.pid_file = os.path.join(d, "pid")
        self.dev_file = os.path.join(d, "dev")
        self.what = " ".join(extra) or "encoded opcodes"
        with open(self.log, "w") as log, open(os.devnull) as null:
            self.p = subprocess.Popen(
                [ublk_bin(), "--pid-file", self.pid_file, "--device-file",
                 self.dev_file, *extra, image],
                stdin=null, stdout=log, stderr=log, start_new_session=True,
                env=env)
        self.started = False
        self.stopped = False
        self.id = None
        cl.push(self.stop)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.pid_file):
            if self.p.poll() is not None:
                raise AssertionError(f"mloop-ublk {self.what} exited {self.p.returncode} "
                                     f"before its pid file: {self.last_line()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"mloop-ublk {self.what}: no pid file after 60 s")
            time.sleep(0.05)
        with open(self.pid_file) as f:
            assert int(f.read()) == self.p.pid, "the pid file names another process"
        with open(self.dev_file) as f:
            self.dev = f.read().strip()
        assert self.dev.startswith("/dev/ublkb"), f"device file says {self.dev!r}"
        self.id = int(self.dev[len("/dev/ublkb"):])
        assert os.path.exists(self.dev), f"{self.dev} named but absent"
        self.started = True

    def last_line(self):
        lines = log_of(self.log).strip().splitlines()
        return lines[-1] if lines else "(empty log)"

    def stop(self):
        """SIGTERM; checks exit 0.  The cleanup action too (kills after 30 s)."""
        if self.stopped:
            return
        self.stopped = True
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            if self.id is not None:
                run([ublk_bin(), "--delete", str(self.id)], check=False)
            raise AssertionError("mloop-ublk ignored SIGTERM for 30 s")
        for line in log_of(self.log).splitlines():
            print(f"# {self.what}: {line}", flush=True)
        # A start that failed was reported already; a SIGKILL was ours.
        if self.started and rc != -signal.SIGKILL:
            assert rc == 0, f"mloop-ublk exit {rc}: {self.last_line()}"


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


def check_refused(cl, args, expect, env=None):
    """mloop-ublk ARGS fails: exit 1, one line naming EXPECT, nothing left."""
    before = leftovers()
    d = tmpdir(cl)
    pid_file = os.path.join(d, "pid")
    p = run([ublk_bin(), "--pid-file", pid_file, *args], check=False, env=env)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1, f"mloop-ublk {args}: exit {p.returncode}, not 1"
    assert len(lines) == 1 and lines[0].startswith("mloop-ublk: ") and expect in lines[0], \
        f"mloop-ublk {args}: not one line naming {expect!r}: {p.stderr!r}"
    assert not os.path.exists(pid_file), f"mloop-ublk {args} left a pid file"
    assert leftovers() == before, f"mloop-ublk {args} left {leftovers()}"
    print(f"# refused {args}: {lines[0]}", flush=True)


def serve_and_check(cl, image, head):
    s = Server(cl, image, ["--queues", "2"])
    dev = s.dev
    size = int(run(["blockdev", "--getsize64", dev]).stdout)
    assert size == SIZE, f"{dev} has {size} bytes, the image {SIZE}"
    assert read_dev(dev, 0, 1 << 20) == head, f"{dev} reads other bytes than the image"
    pattern = os.urandom(PATTERN_LEN)
    pfile = os.path.join(tmpdir(cl), "pattern")
    with open(pfile, "wb") as f:
        f.write(pattern)
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
    # A 1-byte write through the page cache (the kernel reads and writes
    # back the page around it).
    fd = os.open(dev, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xa5", PATTERN_OFF + 4 * MIB - 1)
        os.fsync(fd)
    finally:
        os.close(fd)
    expect = expect[:-1] + b"\xa5"
    assert read_dev(dev, PATTERN_OFF, PATTERN_LEN) == expect, "1-byte write reads back wrong"

    # SIGTERM: exit 0 (stop checks it), and nothing of the device left.
    s.stop()
    wait_until(lambda: not leftovers(), f"{dev} and /dev/ublkc{s.id} to go away "
               f"(left: {leftovers()})")
    assert os.path.exists(s.pid_file), "mloop-ublk removed its pid file (the starter's)"
    with open(image, "rb") as f:
        f.seek(PATTERN_OFF)
        assert f.read(PATTERN_LEN) == expect, "the image lacks the pattern written and zeroed"
        # The engine punches the discarded range out of the file.
        hole = os.lseek(f.fileno(), PATTERN_OFF, os.SEEK_HOLE)
        assert hole == DISCARD_OFF, f"no hole where discarded: first hole at {hole}"
        f.seek(0)
        assert f.read(1 << 20) == head, "the image's head changed"
    return expect


def kill_and_delete(cl, image):
    """SIGKILL leaves the ublk device; --delete N removes it."""
    s = Server(cl, image, ["--queues", "1"])
    cdev = f"/sys/class/ublk-char/ublkc{s.id}"
    s.p.kill()
    s.p.wait()
    time.sleep(1)               # let the kernel notice the io_uring went
    print(f"# after SIGKILL: {s.dev} {'still there' if os.path.exists(s.dev) else 'gone'}, "
          f"{cdev} {'still there' if os.path.exists(cdev) else 'gone'}", flush=True)
    p = run([ublk_bin(), "--delete", str(s.id)], check=False)
    assert p.returncode == 0 and not p.stderr.strip(), \
        f"--delete {s.id}: exit {p.returncode}: {p.stderr.strip()}"
    wait_until(lambda: not leftovers(), f"ublk device {s.id} to go (left: {leftovers()})")
    # Gone already: still 0.
    p = run([ublk_bin(), "--delete", str(s.id)], check=False)
    assert p.returncode == 0, f"--delete of a gone device: exit {p.returncode}: {p.stderr}"


def live_delete(cl, image):
    """--delete N on a device whose server runs: the server's fetches are
    aborted and it deletes the device and exits 0 itself, or --delete
    says, in one line, that the device is still in use."""
    s = Server(cl, image, ["--queues", "1"])
    t = time.monotonic()
    p = run([ublk_bin(), "--delete", str(s.id)], check=False)
    took = time.monotonic() - t
    print(f"# --delete of a live device: exit {p.returncode} after {took:.1f} s: "
          f"{p.stderr.strip() or '(quiet)'}", flush=True)
    if p.returncode == 0:
        rc = s.p.wait(timeout=30)
        assert rc == 0, f"mloop-ublk exit {rc} after --delete: {s.last_line()}"
        assert "stopped from outside" in log_of(s.log), s.last_line()
    else:
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1 and "still in use" in lines[0], \
            f"--delete of a live device: exit {p.returncode}: {p.stderr!r}"
    s.stop()
    wait_until(lambda: not leftovers(), f"ublk device {s.id} to go (left: {leftovers()})")


def window_read_only(cl, image, head):
    """--offset, --sizelimit and --read-only reach the device."""
    half = MIB // 2
    s = Server(cl, image, ["--queues", "1", "--offset", "512K", "--sizelimit", "2M",
                           "--read-only"])
    size = int(run(["blockdev", "--getsize64", s.dev]).stdout)
    assert size == 2 * MIB, f"a 2M window: {s.dev} has {size} bytes"
    assert read_dev(s.dev, 0, half) == head[half:], "the window starts at the wrong byte"
    with open(f"/sys/block/{os.path.basename(s.dev)}/ro") as f:
        assert f.read().strip() == "1", f"{s.dev} is not read-only"
    s.stop()
    wait_until(lambda: not leftovers(), "the window's device to go")


def odd_size(cl):
    """An image of 1 MiB + 100 bytes: the device ends at its last whole
    sector, and mloop-ublk says so."""
    image = os.path.join(tmpdir(cl), "odd.img")
    with open(image, "wb") as f:
        f.write(os.urandom(MIB + 100))
    s = Server(cl, image, ["--queues", "1"])
    size = int(run(["blockdev", "--getsize64", s.dev]).stdout)
    assert size == MIB, f"{s.dev} of a {MIB + 100}-byte image has {size} bytes"
    assert "not a multiple" in log_of(s.log), "no warning about the lost tail"
    s.stop()
    wait_until(lambda: not leftovers(), "the odd-sized image's device to go")


def aio_limit(cl, image, head):
    """fs.aio-max-nr (MLOOP_TEST_AIO_MAX stands in for it): too little
    room for even a small AIO context is refused in one line; room for
    less than the depth asked serves with a smaller depth, and says so."""
    env = dict(os.environ, MLOOP_TEST_AIO_MAX="4")
    check_refused(cl, ["--queues", "2", image], "aio-max-nr", env=env)
    env["MLOOP_TEST_AIO_MAX"] = "100"
    s = Server(cl, image, ["--queues", "2", "--depth", "64"], env=env)
    assert "queue depth of 32 instead of 64" in log_of(s.log), \
        f"no smaller depth under the AIO limit: {log_of(s.log)!r}"
    assert read_dev(s.dev, 0, 1 << 20) == head, "reads wrong with the smaller depth"
    s.stop()
    wait_until(lambda: not leftovers(), "the device to go")


# nbd/stats.h, struct mloop_stats: magic, connections, connections_total,
# requests[6], bytes_read, bytes_written, errors, in_flight.
STATS = struct.Struct("<13Q")


def read_stats(path):
    with open(path, "rb") as f:
        v = STATS.unpack(f.read(STATS.size))
    return {"connections": v[1], "total": v[2], "writes": v[4],
            "bytes_written": v[10], "in_flight": v[12]}


def kill_server(s, settle=0.5):
    """SIGKILL; the device must stay (quiesced, IO held)."""
    s.p.kill()
    s.p.wait()
    s.stopped = True
    for line in log_of(s.log).splitlines():
        if line.startswith("mloop-ublk: "):
            print(f"# {s.what} (killed): {line}", flush=True)
    time.sleep(settle)
    assert os.path.exists(s.dev), f"{s.dev} went away with its --recovery server"


def recovered_line(s):
    """The "recovered" line, written just after the pid file."""
    def lines():
        return [x for x in log_of(s.log).splitlines() if "recovered " in x]
    wait_until(lambda: lines(), f"a 'recovered' line in {s.what}'s log", timeout=10)
    assert s.dev in lines()[0], f"recovered another device: {lines()[0]}"
    return lines()[0]


def read_image(image, off, length):
    with open(image, "rb") as f:
        f.seek(off)
        return f.read(length)


def recover_refusals(cl, image):
    """--recover refuses what it cannot take over, in one line, exit 1,
    the device untouched; --delete removes a quiesced device."""
    check_refused(cl, ["--recover", "97", image], "no ublk device 97")
    s = Server(cl, image, ["--queues", "1"])
    check_refused(cl, ["--recover", str(s.id), image], "without user recovery")
    assert s.p.poll() is None and os.path.exists(s.dev), "--recover disturbed a live device"
    check_refused(cl, ["--recovery", "--recover", str(s.id), image], "without user recovery")
    s.stop()
    wait_until(lambda: not leftovers(), "the device to go")

    s = Server(cl, image, ["--queues", "1", "--recovery"])
    check_refused(cl, ["--recover", str(s.id), image], "is live, served by pid")
    kill_server(s)
    small = make_image(cl, size=SIZE // 2, fill=0, seed=3)
    check_refused(cl, ["--recover", str(s.id), small], "bytes")
    check_refused(cl, ["--recover", str(s.id), "--queues", "2", image], "--queues=2")
    # The device's depth is fixed: AIO contexts that cannot take it all
    # are refused, not shrunk.
    check_refused(cl, ["--recover", str(s.id), image], "aio-max-nr",
                  env=dict(os.environ, MLOOP_TEST_AIO_MAX="40"))
    # A failure after START_USER_RECOVERY (here the device file, written
    # after END_USER_RECOVERY) leaves the device for another --recover.
    check_refused(cl, ["--recover", str(s.id), "--device-file",
                       "/nonexistent/dir/dev", image], "left quiesced")
    assert os.path.exists(s.dev), "a refused --recover removed the device"
    r = Server(cl, image, ["--recover", str(s.id)])
    print(f"# after a failed --recover: {recovered_line(r)}", flush=True)
    assert read_dev(r.dev, 0, MIB) == read_image(image, 0, MIB), "reads wrong after recovery"
    kill_server(r)
    # (With a read held, --delete fails it: EIO, and a kernel "I/O
    # error" line, which the runner's log check counts against the test;
    # docs/design.md, "The ublk transport".)
    p = run([ublk_bin(), "--delete", str(s.id)], check=False)
    assert p.returncode == 0, f"--delete of a quiesced device: exit {p.returncode}: {p.stderr}"
    wait_until(lambda: not leftovers(), f"quiesced ublk device {s.id} to go (left: {leftovers()})")


def recovery(cl, image):
    """SIGKILL with IO in flight, --recover, twice; nothing lost."""
    stats_file = os.path.join(tmpdir(cl), "stats")
    s = Server(cl, image, ["--queues", "2", "--recovery", "--stats-file", stats_file])
    dev, dev_id = s.dev, s.id
    cl.push(lambda: run([ublk_bin(), "--delete", str(dev_id)], check=False))
    a_off, b_off, b_len = 16 * MIB, 24 * MIB, 16 * MIB
    d = tmpdir(cl)
    pattern_a = os.urandom(2 * MIB)
    pattern_b = os.urandom(b_len)
    fa, fb = os.path.join(d, "a"), os.path.join(d, "b")
    for path, data in ((fa, pattern_a), (fb, pattern_b)):
        with open(path, "wb") as f:
            f.write(data)
    run(["dd", f"if={fa}", f"of={dev}", "bs=1M", f"seek={a_off >> 20}",
         "oflag=direct", "conv=fsync,notrunc", "status=none"])
    before = read_stats(stats_file)
    # A writer of many small synchronous writes: still running when the
    # server is killed.
    writer = subprocess.Popen(
        ["dd", f"if={fb}", f"of={dev}", "bs=16k", f"seek={b_off // 16384}",
         "oflag=direct,dsync", "conv=notrunc", "status=none"],
        stderr=subprocess.PIPE, text=True)
    cl.push(lambda: writer.poll() is None and writer.kill())
    time.sleep(0.3)
    in_flight = writer.poll() is None
    kill_server(s)
    t_kill = time.monotonic()
    print(f"# recovery: writer {'still writing' if in_flight else 'done'} at the kill",
          flush=True)
    # A read with no server: held, not failed.
    out = os.path.join(d, "read")
    reader = subprocess.Popen(
        ["dd", f"if={dev}", f"of={out}", "bs=1M", f"skip={a_off >> 20}", "count=2",
         "iflag=direct", "status=none"], stderr=subprocess.PIPE, text=True)
    cl.push(lambda: reader.poll() is None and reader.kill())
    time.sleep(1)
    assert reader.poll() is None, \
        f"a read with no server did not wait: exit {reader.returncode}: {reader.stderr.read()}"
    if in_flight:
        assert writer.poll() is None, "the writer finished with no server"

    r = Server(cl, image, ["--recover", str(dev_id), "--stats-file", stats_file])
    took = time.monotonic() - t_kill
    assert r.id == dev_id and r.dev == dev, f"--recover {dev_id} serves {r.dev}"
    print(f"# recovery: {recovered_line(r)}; {took:.1f} s from kill to served", flush=True)
    assert reader.wait(timeout=60) == 0, f"held read failed: {reader.stderr.read()}"
    assert writer.wait(timeout=120) == 0, f"held write failed: {writer.stderr.read()}"
    with open(out, "rb") as f:
        assert f.read() == pattern_a, "the held read returned other bytes"
    assert read_dev(dev, a_off, len(pattern_a)) == pattern_a, "pattern A lost"
    assert read_dev(dev, b_off, b_len) == pattern_b, "the write loop's data lost"
    after = read_stats(stats_file)
    print(f"# recovery: counters before the kill {before}, after {after}", flush=True)
    assert after["bytes_written"] >= before["bytes_written"] + b_len, \
        "the counters restarted or missed the writes"
    assert after["connections"] == 2, f"connections {after['connections']}, not 2 queues"

    # Again: kill the recovered server with a write running, recover.
    writer2 = subprocess.Popen(
        ["dd", f"if={fa}", f"of={dev}", "bs=16k", f"seek={(a_off + 4 * MIB) // 16384}",
         "oflag=direct,dsync", "conv=notrunc", "status=none"],
        stderr=subprocess.PIPE, text=True)
    cl.push(lambda: writer2.poll() is None and writer2.kill())
    time.sleep(0.2)
    # Recovered at once this time: how long the kernel says EBUSY.
    kill_server(r, settle=0)
    t_kill = time.monotonic()
    r2 = Server(cl, image, ["--recover", str(dev_id), "--queues", "2"])
    took = time.monotonic() - t_kill
    print(f"# recovery 2: {recovered_line(r2)}; {took:.1f} s from kill to served",
          flush=True)
    assert writer2.wait(timeout=120) == 0, f"second held write failed: {writer2.stderr.read()}"
    assert read_dev(dev, a_off + 4 * MIB, len(pattern_a)) == pattern_a, "second write lost"
    assert read_dev(dev, b_off, b_len) == pattern_b, "data lost at the second recovery"
    r2.stop()
    wait_until(lambda: not leftovers(), f"{dev} to go after SIGTERM (left: {leftovers()})")
    with open(image, "rb") as f:
        f.seek(a_off)
        assert f.read(len(pattern_a)) == pattern_a, "image lacks pattern A"
        f.seek(a_off + 4 * MIB)
        assert f.read(len(pattern_a)) == pattern_a, "image lacks the second write"
        f.seek(b_off)
        assert f.read(b_len) == pattern_b, "image lacks the write loop's data"


def run_test(kind, cl):
    if not os.path.exists("/dev/ublk-control"):
        raise Skip("no /dev/ublk-control (ublk_drv: Linux 6.12 kernel tests only)")
    ublk_bin()
    assert not leftovers(), f"ublk devices before the test: {leftovers()}"
    image = make_image(cl, size=SIZE, fill=1 << 20, seed=7)
    with open(image, "rb") as f:
        head = f.read(1 << 20)

    check_refused(cl, ["--no-such-option", image], "--no-such-option")
    check_refused(cl, ["--block-size", "1000", image], "--block-size")
    missing = os.path.join(tmpdir(cl), "missing.img")
    check_refused(cl, [missing], "missing.img")

    aio_limit(cl, image, head)
    expect = serve_and_check(cl, image, head)
    kill_and_delete(cl, image)
    live_delete(cl, image)
    window_read_only(cl, image, head)
    odd_size(cl)
    recover_refusals(cl, image)
    recovery(cl, image)

    # The legacy (bare) command numbers: Debian's 6.12 still has
    # CONFIG_BLKDEV_UBLK_LEGACY_OPCODES; say which way it went.
    try:
        s = Server(cl, image, ["--legacy-opcodes", "--queues", "1"])
    except AssertionError as e:
        print(f"# ublk-smoke: legacy opcodes refused: {e}", flush=True)
    else:
        assert read_dev(s.dev, PATTERN_OFF, PATTERN_LEN) == expect, \
            "pattern reads back wrong with legacy opcodes"
        print("# ublk-smoke: legacy opcodes work too", flush=True)
        s.stop()
    assert not leftovers(), f"left behind: {leftovers()}"
