"""A disk that stalls for longer than the request timeout slows the device
down; it must not break it.  The image is a device-mapper device; the
device is attached with --timeout 5, and while client threads read and
write 4 KiB blocks with O_DIRECT the table is swapped to dm-delay holding
every request STALL_DELAY_MS (8 s), for STALL_S seconds, then back to
linear.

What the kernel does meanwhile (drivers/block/nbd.c, nbd_xmit_timeout):
each request that outlives the 5 s request timeout is requeued on another
connection, and the connection it was sent on is shut down and marked
dead, with an NBD_CMD_LINK_DEAD announcement.  The server lives on, so
there is nothing for the supervisor's restart to do; without more, every
connection is dead after a few timeouts and, after the dead-connection
timeout, all IO fails with EIO for good.  The supervisor answers each
announcement with a new connection (a reconfigure the kernel puts in the
dead slot).

Checked:
- every client request succeeded, reads returned the blocks' data, and
  every block written reads back as written;
- the stall did time requests out (the kernel logged "Connection timed
  out" for the device);
- `mloop status --json`: the supervisor reconnected at least once, and the
  server has as many connections open as the device was attached with;
  for mloop-server the server is the one attach started (same pid, no
  restart).  nbdkit (Debian's 1.32.5) may abort when the kernel shuts a
  connection down under requests in flight (docs/design.md, "Supervision":
  its raw_send_socket assertion); then the restart path takes over, which
  is as good for the device: for nbdkit either is accepted, and the
  summary line says which happened;
- the supervisor's log names the reconnect and why ("request timeout");
- a connection offered to the device once it is whole again is dropped by
  the kernel, which still answers 0, and its send timeout stays zero: the
  supervisor's test of whether the kernel took a socket
  (tests/helpers/nbd-offer.c);
- fio writes and verifies a region of the device afterwards.

run-kernel-tests forgives this test's "Connection timed out", "Receive
control failed" and "Send control failed" lines (a timeout and the
shutdown of its connection), never "Unexpected reply".
"""
import json
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
from kfix import Skip, run, wait_until

DISK_SIZE = 64 << 20
READ_AREA = 8 << 20        # filled before the run, only read in it
FIO_AREA = DISK_SIZE - (8 << 20)   # writes go between; fio after it
TIMEOUT_S = 5
STALL_DELAY_MS = 8000
BEFORE_S, STALL_S, AFTER_S = 1.0, 14.0, 3.0
THREADS = 8
PAUSE = 0.05
FIO_JOBS, FIO_REGION = 2, 2 << 20
HEALED_WITHIN = 60         # seconds after the stall for all connections


def offer_helper():
    """tests/helpers/nbd-offer of the build the CLI comes from."""
    path = os.environ.get("MLOOP_NBD_OFFER")
    if not path:
        cli = os.environ.get("MLOOP_CLI", "")
        path = os.path.join(os.path.dirname(os.path.dirname(cli)), "tests", "helpers",
                            "nbd-offer")
    return path if os.path.exists(path) else None


def attach_args(kind, image):
    args = kind.attach_args(image)
    args[args.index("--timeout") + 1] = str(TIMEOUT_S)
    return args


class Offsets:
    """Hands out offsets in [START, END) in turn, wrapping around."""

    def __init__(self, start, end, step):
        self.start, self.end, self.step, self.next = start, end, step, start
        self.lock = threading.Lock()

    def take(self):
        with self.lock:
            off = self.next
            self.next = self.start + (self.next + self.step - self.start) % (self.end - self.start)
            return off


def client(dev, reads, writes, stop, log, problems):
    """Alternates a write of a block no one wrote before and a read of a
    filled block until STOP; appends (op, offset, start, end, errno)."""
    try:
        buf = mmap.mmap(-1, BLOCK)
        fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
        try:
            n = 0
            while not stop.is_set():
                is_write = n % 2 == 0
                n += 1
                off = (writes if is_write else reads).take()
                if is_write:
                    buf.seek(0)
                    buf.write(pattern(off, 1))
                err, start = 0, time.monotonic()
                try:
                    done = (os.pwrite(fd, buf, off) if is_write
                            else os.preadv(fd, [buf], off))
                    if done != BLOCK:
                        problems.append(f"short {'write' if is_write else 'read'} at {off}")
                except OSError as e:
                    err = e.errno
                log.append(("write" if is_write else "read", off, start, time.monotonic(), err))
                if not is_write and not err and buf[:] != pattern(off, 0):
                    problems.append(f"read at {off} returned other data")
                time.sleep(PAUSE)
        finally:
            os.close(fd)
            buf.close()
    except Exception as e:
        problems.append(repr(e))


def run_test(kind, cl):
    if not isinstance(kind, kinds.MloopCli):
        raise Skip("the supervisor's reconnect is mloop attach's")
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "delay", dmtarget.linear(disk))
    att = kind.attach(cl, dm.path, args=attach_args(kind, dm.path))
    dev = att.device
    devname = os.path.basename(dev)
    fill(dev, 0, READ_AREA)
    before = kind.status(dev)
    assert before["server_running"] and before["restarts"] == 0 \
        and before["reconnects"] == 0, f"before the stall: {before}"
    assert before.get("connections_open") == kind.queues, \
        f"{before.get('connections_open')} of {kind.queues} connections open after attach"
    pid = before["device"]["server_pid"]
    ddir = os.path.dirname(before["device"]["socket"])

    token = f"mloop-stall-reconnect-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<6>{token}: {dev}\n")
    reads = Offsets(0, READ_AREA, 2 * BLOCK)
    writes = Offsets(READ_AREA, FIO_AREA, 2 * BLOCK)
    logs = [[] for _ in range(THREADS)]
    problems, stop = [], threading.Event()
    threads = [threading.Thread(target=client, args=(dev, reads, writes, stop, logs[t], problems))
               for t in range(THREADS)]
    for t in threads:
        t.start()
    try:
        time.sleep(BEFORE_S)
        dm.swap(dmtarget.delay(disk, STALL_DELAY_MS))
        stalled = time.monotonic()
        time.sleep(STALL_S)
        swap = time.monotonic()
        dm.swap(dmtarget.linear(disk))
        recovered = time.monotonic()
        time.sleep(AFTER_S)
        # Until every client has had a request start after the recovery:
        # requests of the stall may still be in their retries (and, with
        # nbdkit, waiting for a restarted server), which a fixed wait
        # cannot bound.
        deadline = recovered + HEALED_WITHIN
        while (time.monotonic() < deadline and
               not all(any(r[2] > recovered for r in list(log)) for log in logs)):
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a client request never finished"
    assert not problems, "; ".join(problems[:10])
    reqs = sorted((r for log in logs for r in log), key=lambda r: r[2])
    failed = [r for r in reqs if r[4]]
    assert not failed, f"{len(failed)} of {len(reqs)} requests failed: {failed[:10]}"
    slowest = max(r[3] - r[2] for r in reqs)
    assert slowest > TIMEOUT_S, \
        f"the slowest request took {slowest:.1f} s, not more than the {TIMEOUT_S} s timeout"
    idle = [t for t, log in enumerate(logs) if not any(r[2] > recovered for r in log)]
    assert not idle, f"clients {idle} started no request within {HEALED_WITHIN} s " \
        "after the disk recovered"

    klog = blockio.kernel_log_around(token)[1]
    timeouts = [line for line in klog if f"{devname}: Connection timed out" in line]
    assert timeouts, f"the kernel logged no request timeout for {dev}"

    def healed():
        s = kind.status(dev)
        return (s["server_running"] and s["kernel_connected"]
                and s.get("connections_open") == kind.queues
                and s["reconnects"] + s["restarts"] > 0)
    wait_until(healed, f"{dev} to have {kind.queues} connections again", HEALED_WITHIN)
    after = kind.status(dev)
    restarted = after["restarts"] > 0
    if kind.server == "native" or not restarted:
        assert not restarted, \
            f"the supervisor restarted the server: {after['last_failure']}"
        assert after["device"]["server_pid"] == pid, \
            f"server pid {pid} became {after['device']['server_pid']}"
        assert after["reconnects"] >= 1, f"no reconnect: {after}"
    with open(os.path.join(ddir, "supervisor.log")) as f:
        slog = f.read()
    for line in slog.splitlines()[-12:]:
        print(f"# supervisor.log: {line}", flush=True)
    # Every announcement was read and counted: none lost, no read failed
    # (when they are, the supervisor offers connections until the kernel
    # takes no more, which would hide a broken count).
    confused = [line for line in slog.splitlines()
                if "netlink events" in line or "were lost" in line]
    assert not confused, f"the supervisor missed announcements: {confused[:5]}"
    if after["reconnects"]:
        assert after["last_reconnect"] == "connection dropped by the kernel (request timeout)", \
            f"last reconnect: {after['last_reconnect']!r}"
        assert re.search(rf"{dev}: connection dropped by the kernel \(request timeout\).*"
                         rf"reconnect \d+ gave the kernel a new connection", slog), \
            f"the supervisor's log names no reconnect:\n{slog[-2000:]}"

    # Written blocks read back as written.
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, BLOCK)
    try:
        for op, off, *_ in reqs:
            if op == "write":
                assert os.preadv(fd, [buf], off) == BLOCK, f"short read at {off}"
                assert buf[:] == pattern(off, 1), f"block at {off} reads back different"
    finally:
        os.close(fd)
        buf.close()

    # The kernel's answer to a connection it has no dead slot for.
    helper = offer_helper()
    offer = "not run (no tests/helpers/nbd-offer)"
    if helper:
        total = kind.status(dev).get("connections_total")
        p = run([helper, after["device"]["socket"], devname[3:], after["device"]["backend"]])
        got = json.loads(p.stdout)
        assert got["reconfigure"] == 0 and got["send_timeout"] == 0, \
            f"a connection offered to the whole {dev}: {got} (expected the kernel " \
            f"to answer 0 and leave the socket alone)"
        wait_until(lambda: (kind.status(dev).get("connections_open") == kind.queues
                            and kind.status(dev).get("connections_total") == total + 1),
                   "the offered connection to be dropped", 30)
        offer = f"answered {got['reconfigure']}, socket not taken"
    blockio.fio_verify(cl, dev, "after-stall", FIO_AREA, FIO_REGION, FIO_JOBS)

    print(f"# stall-reconnect {kind.name}: {len(reqs)} requests, none failed, slowest "
          f"{slowest:.1f} s; {len(timeouts)} timeouts logged; reconnects "
          f"{after['reconnects']}, restarts {after['restarts']}"
          f"{' (' + str(after['last_failure']) + ')' if restarted else ''}; stall "
          f"{swap - stalled:.1f} s, recovery swap {recovered - swap:.1f} s; "
          f"offer to a whole device: {offer}", flush=True)
