#!/usr/bin/python3
"""nbdcopy of an 8 GiB sparse image with three data regions: the copy
compares equal and stays sparse, and mloop reads only the data regions
from the backing file (read_bytes of the server in /proc/PID/io)."""
import os
import shutil
import subprocess
import harness

if shutil.which("nbdcopy") is None:
    harness.skip("nbdcopy (libnbd-bin) is not installed")

SIZE = 8 << 30
REGION = 8 << 20
OFFSETS = [0, 3 << 30, SIZE - REGION]
d = harness.tmpdir()
image = harness.make_image(SIZE, directory=d)
with open(image, "r+b") as f:
    for off in OFFSETS:
        f.seek(off)
        f.write(harness.pattern(REGION, off))
    os.fsync(f.fileno())
copy = os.path.join(d, "copy.img")


def read_bytes(pid):
    with open(f"/proc/{pid}/io") as f:
        return int(next(l for l in f if l.startswith("read_bytes:")).split()[1])


srv = harness.Server(image)
before = read_bytes(srv.proc.pid)
subprocess.run(["nbdcopy", srv.uri, copy], check=True, timeout=600)
read = read_bytes(srv.proc.pid) - before
srv.stop()

data = len(OFFSETS) * REGION
assert os.path.getsize(copy) == SIZE, "copy has the wrong size"
allocated = os.stat(copy).st_blocks * 512
assert allocated <= 2 * data, f"copy not sparse: {allocated} bytes allocated for {data} of data"
assert read <= 2 * data, f"mloop read {read} bytes from the backing file for {data} of data"
assert read >= data, f"read_bytes {read} < data {data}: the measure is not counting"
assert harness.files_equal(image, copy), "the copy differs from the image"
print(f"ok: 8 GiB sparse image copied; {read >> 20} MiB read from the backing file "
      f"for {data >> 20} MiB of data; copy equal with {allocated >> 20} MiB allocated")
