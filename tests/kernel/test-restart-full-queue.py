"""A server killed while it holds every request of every queue comes back
as quickly as one killed with requests to spare.

The image is a dm-delay device, so each request the server takes stays
in its hands DELAY_MS; fio keeps more requests in flight on every queue
than the queue has tags, so at the kill the server holds them all.  That
is the case a ublk driver (Linux 6.12) cannot see through io_uring: with
no fetch command left to cancel, only a request timeout tells it the
server is gone (without one, its 30 s default, while every other queue
waits for that one).  The device must be served again within
RESUME_LIMIT, and fio, verifying every block, sees no error."""
import json
import os
import subprocess
import time

import dmtarget
from kfix import CONNECTIONS, COMMAND_TIMEOUT, tmpdir
from restart import attach, kill_server

DELAY_MS = 500
DISK_SIZE = 64 << 20
JOB_DEPTH = 128  # more than a queue's tags (64 for ublk)
JOB_REGION = 4 << 20
RESUME_LIMIT = 10  # seconds from SIGKILL to a served device, under TCG


def start_fio(dev, cl):
    jobs, cpus = CONNECTIONS, min(os.cpu_count() or 1, CONNECTIONS)
    fio = subprocess.Popen(
        ["fio", "--name=full-queue", f"--filename={dev}", "--ioengine=libaio",
         "--direct=1", "--rw=randwrite", "--bs=4k", f"--iodepth={JOB_DEPTH}",
         f"--numjobs={jobs}", f"--size={JOB_REGION}", f"--offset_increment={JOB_REGION}",
         f"--cpus_allowed=0-{cpus - 1}", "--cpus_allowed_policy=split",
         "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
         "--output-format=json"],
        cwd=tmpdir(cl), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: fio.poll() is None and (fio.kill(), fio.wait()))
    return fio


def run_test(kind, cl):
    disk = dmtarget.scratch_disk(cl, DISK_SIZE)
    dm = dmtarget.Dm.create(cl, "delay", dmtarget.delay(disk, DELAY_MS))
    dev = attach(kind, cl, dm.path, 30).device
    fio = start_fio(dev, cl)
    # Every queue's tags are taken within one delay of fio's start.
    time.sleep(3 * DELAY_MS / 1000 + 1)
    assert fio.poll() is None, "fio ended before the kill"
    took = kill_server(kind, dev)
    out, err = fio.communicate(timeout=COMMAND_TIMEOUT)
    assert fio.returncode == 0, f"fio exit {fio.returncode}: {err.strip()[-2000:]}"
    assert "verify" not in err, f"fio reported: {err.strip()[-2000:]}"
    for j in json.loads(out[out.index("{"):])["jobs"]:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
    assert took <= RESUME_LIMIT, \
        f"the device was served again {took:.1f} s after the kill (limit {RESUME_LIMIT} s)"
    print(f"# served again {took:.1f} s after a SIGKILL with every queue full", flush=True)
