"""A slow disk is not a dead server.  The image is a dm-delay device that
holds every request DELAY_MS (reads, writes and flushes alike), and fio
verifies random writes through the attached device with a full queue
(128 requests, the nbd client's tags per hardware queue) on every
hardware queue at once, plus a writer that fsyncs in the middle of them.
The device is attached with mloop's *default* request and dead-connection
timeouts (no --timeout).  No request may time out (the kernel-log check
fails on "timed out" and "Unexpected reply"); the server is the one
attach started (same pid, no supervisor restart); every connection the
device was attached with is still open and none was opened since (a
request timeout would have made the kernel shut its connection down); and
the server counted no error.

mloop sets the device's queue depth to what the server works on at
once (device/server_kind.c): 128 per connection for mloop-server, 16 for
nbdkit (its default --threads), so no request waits unseen in the server
while its timeout runs; with 128, nbdkit's last request of a burst waited
8 disk latencies (12.6 s seen in the kernel's trace at 1.5 s).  The test
checks the depth.  The worst latency fio saw is printed; it also counts
the wait for a free tag, which the timeout does not.
"""
import json
import os
import re

import dmtarget
from kfix import CONNECTIONS, DEVICE_TIMEOUT, run, sysfs, tmpdir
import kinds

DELAY_MS = 1500
DISK_SIZE = 32 << 20
# Per hardware queue: one job, each with as many requests in
# flight as the nbd client has tags per queue (128), so every connection
# carries a full queue; 16 KiB blocks keep that to one burst per job
# (under TCG, and with nbdkit's 16 requests per connection at a time, a
# burst costs 8 delays).
JOB_DEPTH = 128
JOB_BS = 16 << 10
JOB_REGION = JOB_DEPTH * JOB_BS
# The fsyncing writer: 4 writes in flight, then an fsync, twice.
SYNC_REGION = 32 << 10
HERE = os.path.dirname(os.path.abspath(__file__))


def default_timeout():
    """MLOOP_DEFAULT_TIMEOUT from device/attach.h, None if not found."""
    try:
        with open(os.path.join(HERE, "..", "..", "device", "attach.h")) as f:
            m = re.search(r"#define\s+MLOOP_DEFAULT_TIMEOUT\s+(\d+)", f.read())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def default_attach_args(kind, image):
    """attach_args without --timeout: the attach defaults are under test."""
    args = kind.attach_args(image)
    i = args.index("--timeout")
    return args[:i] + args[i + 2:]


def job_file(dev, jobs, cpus):
    return f"""[global]
filename={dev}
ioengine=libaio
direct=1
verify=crc32c
verify_fatal=1
verify_state_save=0

[storm]
rw=randwrite
bs={JOB_BS}
iodepth={JOB_DEPTH}
numjobs={jobs}
size={JOB_REGION}
offset_increment={JOB_REGION}
end_fsync=1
cpus_allowed=0-{cpus - 1}
cpus_allowed_policy=split

[fsyncer]
rw=write
bs=4k
iodepth=4
size={SYNC_REGION}
offset={jobs * JOB_REGION}
fsync=4
"""


def run_test(kind, cl):
    cli = isinstance(kind, kinds.MloopCli)
    # ublk has no request timeout to default (its driver only resets the
    # timer) and takes its queue depth from mloop-ublk.
    nbd_cli = cli and not isinstance(kind, kinds.MloopUblk)
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "delay", dmtarget.delay(disk, DELAY_MS))
    if nbd_cli:
        att = kind.attach(cl, dm.path, args=default_attach_args(kind, dm.path))
    else:
        att = kind.attach(cl, dm.path)
    dev = att.device
    timeout_ms = int(sysfs(dev, "queue/io_timeout") or 0)
    if nbd_cli:
        want = default_timeout()
        if want is None:  # no source tree here: at least not the tests' own
            assert timeout_ms != DEVICE_TIMEOUT * 1000, \
                f"{dev} has the tests' --timeout {DEVICE_TIMEOUT}, not mloop's default"
        else:
            assert timeout_ms == want * 1000, \
                f"{dev}: request timeout {timeout_ms} ms, mloop's default is {want} s"
        depth = {"native": 128, "nbdkit": 16}[kind.server]
        got = sysfs(dev, "queue/nr_requests")
        assert got == str(depth), \
            f"{dev}: queue depth {got}, not the {depth} requests {kind.server} works on at once"
    if cli:
        before = kind.status(dev)
        assert before["server_running"], f"{dev}: server not running after attach"
        assert before.get("connections_open") == kind.queues, \
            f"{dev}: {before.get('connections_open')} connections open after attach"

    # One job per hardware queue, each on its own CPU where there are
    # enough (blk-mq maps each CPU to one queue).
    jobs = CONNECTIONS
    cpus = min(os.cpu_count() or 1, jobs)
    d = tmpdir(cl)
    with open(os.path.join(d, "slow.fio"), "w") as f:
        f.write(job_file(dev, jobs, cpus))
    # cwd in a private directory: fio drops files (verify state) there.
    p = run(["fio", "--output-format=json", "slow.fio"], check=False, cwd=d)
    assert p.returncode == 0, f"fio exit {p.returncode}: {p.stderr.strip()[-2000:]}"
    assert "verify" not in p.stderr, f"fio reported: {p.stderr.strip()[-2000:]}"
    # fio may print warnings before the JSON document.
    report = json.loads(p.stdout[p.stdout.index("{"):])["jobs"]
    assert len(report) == jobs + 1, f"{len(report)} fio jobs reported, expected {jobs + 1}"
    wclat, rclat, sync = 0, 0, 0
    for j in report:
        size = SYNC_REGION if j["jobname"] == "fsyncer" else JOB_REGION
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == size and j["read"]["io_bytes"] == size, \
            f"job {j['jobname']} wrote {j['write']['io_bytes']} and verified " \
            f"{j['read']['io_bytes']} bytes, expected {size}"
        wclat = max(wclat, j["write"]["clat_ns"]["max"])
        rclat = max(rclat, j["read"]["clat_ns"]["max"])
        sync = max(sync, j.get("sync", {}).get("lat_ns", {}).get("max", 0))
    clat = max(wclat, rclat)
    timeout = f"{timeout_ms / 1000:g} s" if timeout_ms else "none"
    print(f"# slow-disk {kind.name}: disk latency {DELAY_MS} ms, request timeout {timeout}; "
          f"fio clat max: write {wclat / 1e9:.1f} s, read {rclat / 1e9:.1f} s, "
          f"fsync {sync / 1e9:.1f} s", flush=True)
    # The delay was really there, on requests fio waited for.
    assert clat >= DELAY_MS * 1e6, f"fio's slowest request took {clat / 1e6:.0f} ms, " \
        f"less than the disk's delay of {DELAY_MS} ms: is dm-delay under the image?"

    if cli:
        after = kind.status(dev)
        # A request timeout marks its connection dead (the kernel shuts the
        # socket down): the server would see it close, and a reconnect
        # would be a new one.
        kind.assert_same_server(dev, before, after)
        assert after.get("connections_total") == before.get("connections_total"), \
            f"{dev}: {after.get('connections_total')} connections since start, " \
            f"{before.get('connections_total')} before fio"
        assert after.get("errors") == 0, f"{dev}: the server counted {after.get('errors')} errors"
        assert after["requests"]["flush"] > before["requests"]["flush"], \
            f"{dev}: no FLUSH reached the server"
    att.detach()
