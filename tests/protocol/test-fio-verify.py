#!/usr/bin/python3
"""fio's NBD engine (libnbd) writes random blocks of 4 KiB to 1 MiB
from 4 jobs at distinct offsets, checksummed with crc32c, then reads
them back and verifies: 0 mismatches."""
import json
import shutil
import subprocess
import harness

if shutil.which("fio") is None:
    harness.skip("fio is not installed")
if "nbd" not in subprocess.run(["fio", "--enghelp"], capture_output=True, text=True).stdout:
    harness.skip("this fio has no nbd engine")

JOBS, PER_JOB = 4, 32 << 20
image = harness.make_image(JOBS * PER_JOB)
srv = harness.Server(image, ["threads=4"])
p = subprocess.run([
    "fio", "--name=verify", "--ioengine=nbd", f"--uri={srv.uri}",
    "--rw=randwrite", "--bsrange=4k-1m", "--bs_unaligned=0", "--iodepth=16",
    f"--numjobs={JOBS}", f"--size={PER_JOB}", f"--offset_increment={PER_JOB}",
    "--verify=crc32c", "--verify_fatal=1", "--do_verify=1", "--verify_state_save=0",
    "--output-format=json"], capture_output=True, text=True, timeout=600,
    # In a private directory: fio drops files (verify state) in its
    # working directory, the source tree when a test is run by hand.
    cwd=harness.tmpdir())
srv.stop()
out = p.stdout[p.stdout.find("{"):]
assert p.returncode == 0, f"fio failed ({p.returncode}): {p.stderr}\n{p.stdout[-2000:]}"
jobs = json.loads(out)["jobs"]
assert len(jobs) == JOBS
for j in jobs:
    assert j["error"] == 0, f"job {j['jobname']}: error {j['error']}"
    assert j["read"]["io_bytes"] >= PER_JOB, f"job verified only {j['read']['io_bytes']} bytes"
print(f"ok: fio crc32c verify of {JOBS} x {PER_JOB >> 20} MiB, 0 mismatches")
