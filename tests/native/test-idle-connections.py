#!/usr/bin/python3
"""1000 idle TCP connections that never send a byte cost mloop-server a
descriptor and a small-stacked thread each, nothing more: while they are
open a libnbd client reads and writes correct data; the server's fds,
threads, address space and resident memory grow by a bounded amount per
connection, and it creates no AIO context for them; once they time out,
or once their clients close them, fds and threads are back to baseline.
The server starts with an open-files soft limit of 256 (it raises it to
the hard limit itself).  With --max-handshakes 16, a flood of 40 idle
connections keeps at most 16 threads and the 16 newest connections; the
oldest are dropped (logged within the bound on repeated lines), a prompt client still gets in, and
SIGTERM drops those still pending and exits 0 at once."""
import os
import socket
import time

import harness
import netserver

N = 1000
# Under valgrind, starting 1000 threads takes a few seconds.
TIMEOUT = 45 if harness.VALGRIND else 10
# Per idle connection: one descriptor and one thread.  The thread's stack
# is 64 KiB of address space (plus a guard page): a bound of 80 KiB each
# fails if stacks were the default 8 MiB, or if handshake threads made
# glibc create malloc arenas (64 MiB each).  A handshake touches its 4 KiB
# option buffer and the thread's descriptor and TLS: ~12 KiB resident
# measured, bounded at 32 KiB.
VM_PER_CONN_KIB = 64 + 16
RSS_PER_CONN_KIB = 32

netserver.raise_own_nofile(N + 256)
image = harness.make_image(8 << 20)
# valgrind runs at most 500 threads unless told otherwise, and fixes the
# client's open-files limit at start (the server's setrlimit cannot raise
# it): there the server starts with the test's limit.
srv = netserver.NetServer(image, ["--handshake-timeout", str(TIMEOUT)],
                          nofile=None if harness.VALGRIND else 256,
                          valgrind_args=[f"--max-threads={N + 100}"])
if not harness.VALGRIND:
    assert "open files" not in srv.log_text(), srv.log_text()


def baseline():
    """fds and threads of the idle server, once steady for half a second."""
    samples = []
    for _ in range(400):
        samples = samples[-9:] + [(srv.fds(), srv.threads())]
        if len(samples) == 10 and len(set(samples)) == 1:
            return samples[0]
        time.sleep(0.05)
    raise AssertionError(f"fds and threads never settled: {samples}")


def open_idle(n):
    socks = []
    for _ in range(n):
        s = socket.create_connection(srv.addr)
        socks.append(s)
    harness.on_exit(lambda: [s.close() for s in socks])
    return socks


def wait_for(what, fn, timeout=20):
    deadline = time.monotonic() + timeout
    while not fn():
        assert srv.alive(), f"server died: {srv.log_text()}"
        assert time.monotonic() < deadline, \
            f"timed out waiting for {what}: fds {srv.fds()} (baseline {fds0}), " \
            f"threads {srv.threads()} (baseline {threads0})"
        time.sleep(0.05)


def exercise(tag):
    """A normal client reads back what it wrote."""
    h = srv.connect()
    data = harness.pattern(1 << 20, seed=tag)
    h.pwrite(data, 1 << 20)
    h.flush()
    assert h.pread(1 << 20, 1 << 20) == data, "data read back differs"
    h.shutdown()


# One client per worker first (round robin), so that each has its malloc
# arena and buffers before the baseline is taken.
for i in range(8):
    exercise(i)
fds0, threads0 = baseline()
rss0, vm0 = srv.status_kib("VmRSS"), srv.status_kib("VmSize")
aio0 = srv.aio_contexts()
aio_nr0 = int(open("/proc/sys/fs/aio-nr").read())
assert aio0 >= 1, "expected the workers' AIO contexts in /proc/PID/maps"

figures = []
for round_, how in enumerate(("time out", "closed by the clients")):
    t0 = time.monotonic()
    socks = open_idle(N)
    wait_for(f"{N} handshake threads",
             lambda: srv.fds() >= fds0 + N and srv.threads() >= threads0 + N,
             timeout=TIMEOUT - 30 if harness.VALGRIND else 5)
    opened = time.monotonic() - t0
    fds, threads = srv.fds(), srv.threads()
    rss, vm = srv.status_kib("VmRSS"), srv.status_kib("VmSize")
    aio = srv.aio_contexts()
    aio_nr = int(open("/proc/sys/fs/aio-nr").read())
    exercise(10 + round_)
    wait_for("the client's fd and thread gone",
             lambda: (srv.fds(), srv.threads()) == (fds, threads), timeout=5)
    # Exactly one fd and one thread per idle connection.
    assert fds == fds0 + N, f"fds {fds}, baseline {fds0}"
    assert threads == threads0 + N, f"threads {threads}, baseline {threads0}"
    # Neither valgrind's nor ASan's own per-thread memory is ours.
    if not harness.VALGRIND and not harness.SANITIZED:
        assert vm - vm0 <= N * VM_PER_CONN_KIB, f"VmSize grew {vm - vm0} KiB"
        assert rss - rss0 <= N * RSS_PER_CONN_KIB, f"VmRSS grew {rss - rss0} KiB"
    assert aio == aio0, f"AIO contexts {aio0} -> {aio}"
    figures.append(f"{N} idle ({how}): +{fds - fds0} fds, +{threads - threads0} threads, "
                   f"VmRSS +{(rss - rss0) // 1024} MiB ({(rss - rss0) / N:.1f} KiB each), "
                   f"VmSize +{(vm - vm0) // 1024} MiB, AIO contexts {aio0} -> {aio} "
                   f"(aio-nr {aio_nr0} -> {aio_nr}, system-wide), opened in {opened:.2f} s")

    if how == "time out":
        # The server drops every one of them; they see EOF.
        deadline = t0 + TIMEOUT + (30 if harness.VALGRIND else 5)
        for s in socks:
            netserver.wait_eof(s, max(0.1, deadline - time.monotonic()))
        dropped = time.monotonic() - t0
        figures.append(f"all {N} dropped {dropped:.1f} s after the first connected "
                       f"(timeout {TIMEOUT} s)")
    for s in socks:
        s.close()
    t1 = time.monotonic()
    srv.settle(fds0, threads0, timeout=30 if harness.VALGRIND else 5)
    if how != "time out":
        figures.append(f"back to baseline {time.monotonic() - t1:.2f} s after the clients closed")
    exercise(20 + round_)

srv.stop()

# The cap: 40 idle connections against --max-handshakes 16.
srv = netserver.NetServer(image, ["--max-handshakes", "16", "--handshake-timeout", "60"])
exercise(30)
fds0, threads0 = baseline()
socks = open_idle(40)
time.sleep(0.5)
# The newest 16 are kept, the 24 oldest dropped, in order.
for i, s in enumerate(socks[:24]):
    try:
        netserver.wait_eof(s, 10)
    except AssertionError:
        raise AssertionError(f"idle connection {i} of 40 kept beyond the cap")
wait_for("16 pending threads", lambda: srv.threads() == threads0 + 16, timeout=10)
assert srv.fds() == fds0 + 16, f"fds {srv.fds()}, baseline {fds0}"
for i, s in enumerate(socks[24:]):
    s.setblocking(False)
    try:
        assert s.recv(1) != b"", f"connection {24 + i} dropped, though among the newest 16"
    except BlockingIOError:
        pass  # still open, as it should be
# One line per drop, within the bound on repeated lines (log_limit.h:
# 20 a window), counted as suppressed beyond it.
drops = srv.log_text().count("--max-handshakes): dropped the oldest")
assert 1 <= drops <= 20, srv.log_text()
exercise(31)  # evicts one more idle connection to get in
# SIGTERM with 15 connections still negotiating: they are dropped, and
# the server exits 0 at once (not after their 60 s timeout).
t0 = time.monotonic()
srv.stop()
stopped = time.monotonic() - t0
assert stopped < (30 if harness.VALGRIND else 3), f"took {stopped:.1f} s to stop"
for s in socks[25:]:
    netserver.wait_eof(s, 1)
for s in socks:
    s.close()
figures.append(f"--max-handshakes 16: 16 newest of 40 kept, 24 oldest dropped, {drops} log lines; "
               f"SIGTERM with 15 pending: exit 0 in {stopped:.2f} s")
print("ok: " + "; ".join(figures))
