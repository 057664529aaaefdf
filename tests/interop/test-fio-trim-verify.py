#!/usr/bin/python3
"""fio (NBD engine) on a mixed trim + write workload with crc32c verify
from 4 jobs at distinct offsets, then a random read/write verify pass:
0 mismatches.  (Each trim/write pair runs at queue depth 1 inside a job:
fio's trimwrite otherwise races a block's trim with its own write.)"""
import json
import shutil
import subprocess
import harness

if shutil.which("fio") is None:
    harness.skip("fio is not installed")

JOBS, PER_JOB = 4, 16 << 20
image = harness.make_image(JOBS * PER_JOB)
srv = harness.Server(image)
# fio's working directory: fio drops files (verify state) there, and
# ours is the source tree when a test is run by hand.
work = harness.tmpdir()


def fio(*args):
    p = subprocess.run(["fio", "--ioengine=nbd", f"--uri={srv.uri}", f"--numjobs={JOBS}",
                        f"--size={PER_JOB}", f"--offset_increment={PER_JOB}",
                        "--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0",
                        "--output-format=json", *args],
                       capture_output=True, text=True, timeout=600, cwd=work)
    assert p.returncode == 0, f"fio failed: {p.stderr}\n{p.stdout[-2000:]}"
    jobs = json.loads(p.stdout[p.stdout.find("{"):])["jobs"]
    for j in jobs:
        assert j["error"] == 0, f"{j['jobname']}: error {j['error']}"
    return jobs


jobs = fio("--name=trimwrite", "--rw=randtrimwrite", "--bs=64k", "--iodepth=1")
assert sum(j["trim"]["io_bytes"] for j in jobs) > 0, "no trims issued"
assert sum(j["read"]["io_bytes"] for j in jobs) > 0, "nothing verified"
jobs = fio("--name=randrw", "--rw=randrw", "--bsrange=4k-256k", "--iodepth=16")
srv.stop()
print("ok: trim+write and read/write crc32c verify, 0 mismatches")
