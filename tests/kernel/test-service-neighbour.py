"""One device cannot hurt another: two devices kept by one mloopd, A over
a device-mapper device whose table the test swaps, B over a linear one.
fio measures B's 4 KiB random reads (O_DIRECT, one at a time) in three
phases, each WINDOWS (3) windows of MEASURE_S (3 s) after a second of
ramp:

- alone, A idle;
- while A's disk stalls (dm-delay holding every request STALL_MS, 5 s)
  under fio's reads and writes on A: A is attached with a request timeout
  of A_TIMEOUT_S (3 s), so each of its requests times out, is requeued
  and its connection shut down by the kernel, and mloopd reconnects A
  (as in test-stall-reconnect.py) while B is measured;
- while A's disk fails every request (dm-flakey) under fio on A, at
  FAILING_IOPS (below: the kernel logs every failed reply).

B's 99th percentile completion latency under A's stall, and under A's
failure, must stay within RATIO (2x) of B's alone, taking each phase's
median window (one host hiccup under TCG can double one window's p99:
seen with single 6 s windows, 2.9x once, B's p50 and IOPS moving as
much).  Measured under TCG: 1.1-1.5x under the stall, 1.0-1.5x under
the failure.  Every window is printed (p50, p99, IOPS).  Also checked:
B's reads all succeeded, the kernel logged nothing about B (no IO
error, no timeout, no connection failure) and B kept its server and
connections; A's requests timed out, mloopd reconnected A with the same
server (no restart) and every connection of A is open again, none of
A's requests under the stall failed (they waited), and under the failure
they did fail; mloopd answered its control socket throughout (the
slowest `list`, 0.01-0.04 s measured, must be under LIST_WITHIN).

run-kernel-tests forgives A's timeouts and dropped connections (as for
test-stall-reconnect.py) and its IO errors (as for test-failing-disk.py)
in this test, which checks B itself.  Cost: nine 4 s windows, the
stall's drain and A's healing: about 52 s under TCG, so the full tier
only (the standard tier's stall-reconnect runs the same reconnects)."""
import json
import os
import re
import statistics
import subprocess
import threading
import time
import uuid

import blockio
import dmtarget
from kfix import run, sysfs, tmpdir, wait_until
from service import for_test

DISK_SIZE = 64 << 20
READ_AREA = 16 << 20       # B's reads, filled first
A_AREA = 16 << 20          # A's fio
STALL_MS = 5000
A_TIMEOUT_S = 3
# B is measured in WINDOWS windows of MEASURE_S seconds, each after RAMP_S;
# what counts is the median of their p99s: under TCG a host's hiccup
# (the VM's 4 vCPUs run on 2 shared cores) can double one window's p99,
# and B's p50 and IOPS with it, whatever A does.
WINDOWS = 3
MEASURE_S = 3
RAMP_S = 1
RATIO = 2.0
LIST_WITHIN = 5.0          # seconds for mloopd to answer `list`
HEALED_WITHIN = 60
# A's failing requests per second (reads, and writes), whose every reply
# the nbd driver logs without a rate limit ("Other side returned error"):
# at full speed fio made 20,000 such lines in one phase, which pushed the
# test's mark out of the kernel log and all went to the VM's serial
# console; 20 a second keep A failing all the time without that.
FAILING_IOPS = 20


def attach_args(kind, image, timeout=None):
    args = kind.attach_args(image)
    if timeout:
        args[args.index("--timeout") + 1] = str(timeout)
    return args


def measure(cl, dev, what):
    """B's random 4 KiB reads, one at a time, in WINDOWS windows of
    MEASURE_S seconds after RAMP_S each: a list of (p50, p99) in ms and
    the IOPS, one per window."""
    windows = "".join(f"[{what}-{i}]\nstonewall\n" for i in range(WINDOWS))
    d = tmpdir(cl)
    with open(os.path.join(d, "b.fio"), "w") as f:
        f.write(f"""[global]
filename={dev}
ioengine=libaio
direct=1
rw=randread
bs=4k
iodepth=1
size={READ_AREA}
time_based
runtime={MEASURE_S}
ramp_time={RAMP_S}
{windows}""")
    p = run(["fio", "--output-format=json", "b.fio"], check=False, cwd=d)
    assert p.returncode == 0, f"fio on B ({what}): exit {p.returncode}: {p.stderr[-2000:]}"
    got = []
    for job in json.loads(p.stdout[p.stdout.index("{"):])["jobs"]:
        assert job["error"] == 0, f"fio on B ({what}): error {job['error']}"
        pct = job["read"]["clat_ns"]["percentile"]
        got.append((pct["50.000000"] / 1e6, pct["99.000000"] / 1e6, job["read"]["iops"]))
    assert len(got) == WINDOWS, f"fio on B ({what}) reported {len(got)} windows"
    return got


def p99(windows):
    """The median of the windows' p99."""
    return statistics.median(w[1] for w in windows)


def load_on(cl, dev, seconds, failing=False):
    """fio on A: random 4 KiB reads and writes, 16 at a time, for SECONDS;
    FAILING: past errors, at FAILING_IOPS."""
    return subprocess.Popen(
        ["fio", "--name=neighbour", f"--filename={dev}", "--ioengine=libaio", "--direct=1",
         "--rw=randrw", "--bs=4k", "--iodepth=16", f"--size={A_AREA}", "--time_based",
         f"--runtime={seconds}", "--output-format=json"]
        + ([f"--rate_iops={FAILING_IOPS}", "--continue_on_error=all"] if failing else []),
        cwd=tmpdir(cl), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def load_result(fio):
    """A's fio's exit status and the errors its job counted."""
    out, err = fio.communicate(timeout=240)
    try:
        job = json.loads(out[out.index("{"):])["jobs"][0]
    except ValueError:
        return fio.returncode, None, err[-2000:]
    # total_err: the errors continue_on_error went past (reported with it only).
    return fio.returncode, job["total_err"] if "total_err" in job else job["error"], err[-2000:]


class ListTimer:
    """Asks mloopd for its list every 0.2 s until stopped; keeps the
    slowest answer's time and any failure."""

    def __init__(self, service):
        self.service, self.slowest, self.failed = service, 0.0, None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)
        self.thread.start()

    def loop(self):
        while not self.stop.wait(0.2):
            start = time.monotonic()
            try:
                self.service.kept()
            except OSError as e:
                self.failed = repr(e)
            self.slowest = max(self.slowest, time.monotonic() - start)

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.slowest


def run_test(kind, cl):
    service = for_test(kind, cl)
    disk_a = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm_a = dmtarget.Dm.create(cl, "delay", dmtarget.linear(disk_a))
    disk_b = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm_b = dmtarget.Dm.create(cl, "linear", dmtarget.linear(disk_b))
    a = kind.attach(cl, dm_a.path, args=attach_args(kind, dm_a.path, A_TIMEOUT_S)).device
    b = kind.attach(cl, dm_b.path, args=attach_args(kind, dm_b.path)).device
    blockio.fill(b, 0, READ_AREA)
    before_a = kind.status(a)
    before_b = kind.status(b)
    for dev, s in ((a, before_a), (b, before_b)):
        assert s["service_kept"] and s["supervisor_running"], f"{dev} is not kept by mloopd: {s}"
    token = f"mloop-service-neighbour-{uuid.uuid4().hex}"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<6>{token}: A {a}, B {b}\n")

    results = {"alone": measure(cl, b, "alone")}
    lists = ListTimer(service)
    cl.push(lists.done)

    # A's disk stalls under fio's requests; B is measured meanwhile.
    dm_a.swap(dmtarget.delay(disk_a, STALL_MS))
    fio_a = load_on(cl, a, WINDOWS * (RAMP_S + MEASURE_S) + 2)
    cl.push(lambda: fio_a.poll() is None and (fio_a.kill(), fio_a.wait()))
    wait_until(lambda: sum(map(int, (sysfs(a, "inflight") or "0").split())) > 0,
               "A to have requests in its stalled disk")
    results["A stalled"] = measure(cl, b, "A stalled")
    dm_a.swap(dmtarget.linear(disk_a))
    status_a, errors_a, err = load_result(fio_a)
    assert status_a == 0 and errors_a == 0, \
        f"fio on A under the stall: exit {status_a}, {errors_a} errors: {err}"

    def healed():
        s = kind.status(a)
        return (s["server_running"] and s["kernel_connected"]
                and s.get("connections_open") == kind.queues)
    wait_until(healed, f"{a} to have {kind.queues} connections again", HEALED_WITHIN)
    after_a = kind.status(a)
    assert after_a["restarts"] == 0 and \
        after_a["device"]["server_pid"] == before_a["device"]["server_pid"], \
        f"A's server was restarted: {after_a.get('last_failure')}"
    assert after_a["reconnects"] >= 1, f"mloopd never reconnected A: {after_a}"

    # A's disk fails every request under fio's.
    dm_a.swap(dmtarget.flakey(disk_a), target="flakey")
    fio_a = load_on(cl, a, WINDOWS * (RAMP_S + MEASURE_S) + 2, failing=True)
    cl.push(lambda: fio_a.poll() is None and (fio_a.kill(), fio_a.wait()))
    time.sleep(1)
    results["A failing"] = measure(cl, b, "A failing")
    status_a, errors_a, err = load_result(fio_a)
    dm_a.swap(dmtarget.linear(disk_a))
    assert errors_a, f"fio on A saw no error from its failing disk (exit {status_a}): {err}"
    slowest_list = lists.done()
    assert lists.failed is None, f"mloopd did not answer: {lists.failed}"

    alone = p99(results["alone"])
    for what, windows in results.items():
        print(f"# B {what}: p99 {p99(windows):.2f} ms ({p99(windows) / alone:.2f}x alone); "
              "windows (p50/p99 ms, IOPS): "
              + ", ".join(f"{p50:.2f}/{w99:.2f} {iops:.0f}" for p50, w99, iops in windows),
              flush=True)
    print(f"# A: {after_a['reconnects']} reconnects, {errors_a} errors while failing; "
          f"slowest mloopd list {slowest_list:.2f} s", flush=True)
    klog = blockio.kernel_log_around(token)[1]
    name_a, name_b = os.path.basename(a), os.path.basename(b)
    about_b = [line for line in klog if re.search(rf"\b{name_b}\b", line)]
    assert not about_b, f"the kernel logged about B: {about_b[:5]}"
    timeouts = [line for line in klog if f"{name_a}: Connection timed out" in line]
    assert timeouts, f"A's requests never timed out ({a})"
    print(f"# A: {len(timeouts)} timeouts logged", flush=True)
    after_b = kind.status(b)
    kind.assert_same_server(b, before_b, after_b)

    for what in ("A stalled", "A failing"):
        assert p99(results[what]) <= RATIO * alone, \
            f"B's p99 with {what}: {p99(results[what]):.2f} ms, more than {RATIO}x " \
            f"{alone:.2f} ms alone"
    assert slowest_list < LIST_WITHIN, \
        f"mloopd took {slowest_list:.1f} s to answer a list while A stalled"
