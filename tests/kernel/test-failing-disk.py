"""A failing disk: the image is a device-mapper device that, while the
attached device is busy, returns errors for a few seconds (dm-flakey, every
request fails) and then recovers (a linear table again).

Client threads write and read 4 KiB blocks with O_DIRECT, each request at
an offset no other request uses, with a free block between any two (the
block layer cannot merge them: one client request is one kernel request is
one server request), recording when each started and ended and its errno.
Then:

- every request that ended before the fault began, or started after it
  ended, succeeded; every one that ran wholly inside it failed, and every
  failure is EIO (requests across a table swap may go either way);
- the kernel logged "I/O error, dev DEV, sector S" only for failed
  requests, each at most once; the line is printk_ratelimited (10 per 5 s
  per boot, for all devices), so a failure may go unlogged, but then the
  burst must have been used up by logged ones.  The nbd kinds also log
  "Other side returned error" for each failed reply, unlimited: exactly as
  many as the client saw failures;
- mloop kinds: the same server process serves before and after, the
  supervisor did not restart it, and `mloop status` counts one error per
  failed request (requests cannot merge, see above);
- after recovery, every block written successfully reads back as written,
  and every successful read during the run returned the block's data.  A
  block whose write failed may hold its old or its new data (the device
  promises nothing for it); the summary line counts which;
- fio writes and verifies a region of the recovered device.
"""
import errno
import mmap
import os
import re
import threading
import time
import uuid

import blockio
import dmtarget
import kinds
from blockio import BLOCK, fill, pattern

DISK_SIZE = 128 << 20
# Blocks [0, READ_AREA) are filled before the run and only read in it;
# writes go to [READ_AREA, FIO_AREA); fio uses the rest after recovery.
READ_AREA = 16 << 20
FIO_AREA = DISK_SIZE - (8 << 20)
THREADS = 4
PAUSE = 0.05           # seconds each thread waits between its requests
BEFORE, FAULT, AFTER = 1.0, 2.5, 1.0  # seconds of each phase
FIO_JOBS, FIO_REGION = 2, 2 << 20
# printk_ratelimited()'s burst (DEFAULT_RATELIMIT_BURST) for the kernel's
# "I/O error" line (block/blk-mq.c, blk_print_req_error).
PRINTK_BURST = 10
IO_ERROR = re.compile(r"I/O error, dev (\w+), sector (\d+) op 0x[0-9a-f]+:\((\w+)\)")
OTHER_SIDE = re.compile(r"block (nbd\d+): Other side returned error \((\d+)\)")
SUPPRESSED = re.compile(r"blk_print_req_error: (\d+) callbacks suppressed")
STAMP = re.compile(r"^\[\s*(\d+\.\d+)\]")
PRINTK_INTERVAL = 5.0  # seconds, DEFAULT_RATELIMIT_INTERVAL


class Slots:
    """Hands out offsets no request used before, one free block apart."""

    def __init__(self, start, end):
        self.next, self.end = start, end
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            if self.next + BLOCK > self.end:
                return None
            off = self.next
            self.next += 2 * BLOCK
            return off


class Request:
    __slots__ = ("op", "offset", "start", "end", "err")

    def __init__(self, op, offset, start, end, err):
        self.op, self.offset, self.start, self.end, self.err = op, offset, start, end, err

    def __repr__(self):
        return f"{self.op}@{self.offset}[{self.start:.3f}-{self.end:.3f}]{self.err}"


def client(dev, t, reads, writes, stop, log, read_bad, problems):
    """Alternates a write of a new block and a read of a filled one until
    STOP, appending a Request for each to LOG."""
    try:
        buf = mmap.mmap(-1, BLOCK)
        fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
        try:
            n = 0
            while not stop.is_set():
                is_write = n % 2 == 0
                n += 1
                off = (writes if is_write else reads).take()
                if off is None:
                    problems.append(f"thread {t}: out of {'write' if is_write else 'read'} "
                                    f"slots; make the disk bigger")
                    return
                if is_write:
                    buf.seek(0)
                    buf.write(pattern(off, 1))
                err, start = 0, time.monotonic()
                try:
                    done = (os.pwrite(fd, buf, off) if is_write
                            else os.preadv(fd, [buf], off))
                    if done != BLOCK:
                        problems.append(f"thread {t}: short {'write' if is_write else 'read'} "
                                        f"at {off}: {done} bytes")
                except OSError as e:
                    err = e.errno
                end = time.monotonic()
                log.append(Request("write" if is_write else "read", off, start, end, err))
                if not is_write and err == 0 and buf[:] != pattern(off, 0):
                    read_bad.append(off)
                time.sleep(PAUSE)
        finally:
            os.close(fd)
            buf.close()
    except Exception as e:
        problems.append(f"thread {t}: {e!r}")


def read_block(fd, buf, off):
    assert os.preadv(fd, [buf], off) == BLOCK, f"short read at {off}"
    return buf[:]


def stamp(line):
    m = STAMP.search(line)
    return float(m.group(1)) if m else None


def run_test(kind, cl):
    dmtarget.load("flakey")
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "flakey", dmtarget.linear(disk))
    att = kind.attach(cl, dm.path)
    dev = att.device
    devname = os.path.basename(dev)
    cli = isinstance(kind, kinds.MloopCli)
    fill(dev, 0, READ_AREA)
    if cli:
        before = kind.status(dev)
        assert before["server_running"] and before["restarts"] == 0, \
            f"before the fault: {before}"

    # Not "mloop-ktest: ", which run-kernel-tests reads as a test's start.
    token = f"mloop-failing-disk-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<6>{token}: {dev}\n")

    reads, writes = Slots(0, READ_AREA), Slots(READ_AREA, FIO_AREA)
    logs = [[] for _ in range(THREADS)]
    read_bad, problems, stop = [], [], threading.Event()
    threads = [threading.Thread(target=client,
                                args=(dev, t, reads, writes, stop, logs[t], read_bad, problems))
               for t in range(THREADS)]
    for t in threads:
        t.start()
    try:
        time.sleep(BEFORE)
        swap1 = time.monotonic()
        dm.swap(dmtarget.flakey(disk))
        fault = time.monotonic()
        time.sleep(FAULT)
        swap2 = time.monotonic()
        dm.swap(dmtarget.linear(disk))
        recovered = time.monotonic()
        time.sleep(AFTER)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not problems, "; ".join(problems)
    reqs = sorted((r for log in logs for r in log), key=lambda r: r.start)

    # What the client saw, against when the table was swapped.
    early = [r for r in reqs if r.end < swap1]
    inside = [r for r in reqs if r.start > fault and r.end < swap2]
    late = [r for r in reqs if r.start > recovered]
    failed = [r for r in reqs if r.err]
    assert early and inside and late, \
        f"requests before/in/after the fault: {len(early)}/{len(inside)}/{len(late)}"
    bad = [r for r in early + late if r.err]
    assert not bad, f"requests outside the fault failed: {bad[:10]}"
    bad = [r for r in inside if not r.err]
    assert not bad, f"requests inside the fault succeeded: {bad[:10]}"
    bad = [r for r in failed if r.err != errno.EIO]
    assert not bad, f"failed with another errno than EIO: {bad[:10]}"
    assert not read_bad, f"reads returned wrong data at {read_bad[:10]}"

    # What the kernel logged.
    earlier, klog = blockio.kernel_log_around(token)
    failed_at = {(r.op.upper(), r.offset // 512) for r in failed}
    logged = [(m.group(3), int(m.group(2))) for m in map(IO_ERROR.search, klog)
              if m and m.group(1) == devname]
    strangers = [line for line in klog
                 if IO_ERROR.search(line) and IO_ERROR.search(line).group(1) != devname]
    assert not strangers, f"I/O errors logged for other devices: {strangers[:5]}"
    assert len(set(logged)) == len(logged), f"a request logged twice: {logged}"
    wrong = sorted(set(logged) - failed_at)
    assert not wrong, f"I/O error logged for requests that succeeded: {wrong[:10]}"
    # The kernel counts the lines it held back, and says how many when it
    # next prints after their window: from our first line on, those are
    # this test's (one before it counts an earlier test's).
    suppressed, ours = 0, False
    for line in klog:
        m, s = IO_ERROR.search(line), SUPPRESSED.search(line)
        ours |= bool(m) and m.group(1) == devname
        if s and ours:
            suppressed += int(s.group(1))
    assert len(logged) + suppressed <= len(failed), \
        f"{len(logged)} I/O errors logged and {suppressed} suppressed, " \
        f"but {len(failed)} requests failed"
    if len(logged) < len(failed):
        # Rate limited: the window that starts with the first failure
        # prints PRINTK_BURST lines at least, unless an earlier test's
        # line opened it less than PRINTK_INTERVAL before.
        first = next(stamp(line) for line in klog if IO_ERROR.search(line))
        before_ours = [stamp(line) for line in earlier if IO_ERROR.search(line)]
        shared = bool(before_ours) and (first is None or before_ours[-1] is None
                                        or before_ours[-1] > first - PRINTK_INTERVAL)
        assert shared or len(logged) >= PRINTK_BURST, \
            f"{len(failed)} requests failed, only {len(logged)} logged: {logged}"
    other_side = [m for m in map(OTHER_SIDE.search, klog) if m and m.group(1) == devname]
    if not isinstance(kind, (kinds.Loop, kinds.MloopUblk)):  # nbd's own message
        assert len(other_side) == len(failed), \
            f"nbd logged {len(other_side)} error replies, the client saw {len(failed)} failures"
        assert all(m.group(2) == str(errno.EIO) for m in other_side), \
            f"error replies other than EIO: {[m.group(0) for m in other_side][:5]}"

    # The server went on, and counted.
    counted = "n/a"
    if cli:
        after = kind.status(dev)
        kind.assert_same_server(dev, before, after)
        assert after["kernel_connected"], f"{dev}: the kernel let go of the device"
        # One error per failed client request: the requests cannot merge
        # (a free block between any two) and nothing else is sent to the
        # device meanwhile (no flush: O_DIRECT without O_SYNC).
        counted = after["errors"] - before["errors"]
        assert counted == len(failed), \
            f"mloop status counts {counted} errors, the client saw {len(failed)} failures"

    # Every block written successfully holds what was written; reads work.
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BLOCK)
    failed_writes = {"old": 0, "new": 0, "other": 0}
    try:
        for r in reqs:
            if r.op != "write":
                continue
            data = read_block(fd, buf, r.offset)
            if not r.err:
                assert data == pattern(r.offset, 1), \
                    f"block at {r.offset} written successfully reads back different"
            else:
                which = ("new" if data == pattern(r.offset, 1)
                         else "old" if data == bytes(BLOCK) else "other")
                failed_writes[which] += 1
    finally:
        os.close(fd)
        buf.close()
    blockio.fio_verify(cl, dev, "after-fault", FIO_AREA, FIO_REGION, FIO_JOBS)

    nw = sum(r.op == "write" for r in failed)
    print(f"# failing-disk: {kind.name}: {len(reqs)} requests, {len(failed)} failed with EIO "
          f"({nw} writes, {len(failed) - nw} reads; {len(inside)} wholly inside the "
          f"{swap2 - fault:.1f} s fault); kernel logged {len(logged)} I/O error lines"
          f"{f' ({suppressed} suppressed)' if suppressed else ''}, "
          f"{len(other_side)} nbd error replies; mloop status errors {counted}; "
          f"failed writes hold old/new/other data: {failed_writes['old']}/"
          f"{failed_writes['new']}/{failed_writes['other']}; swaps took "
          f"{fault - swap1:.2f} s and {recovered - swap2:.2f} s", flush=True)
