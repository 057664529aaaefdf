#!/usr/bin/python3
"""With O_DIRECT (the default) reading through mloop leaves the image out
of the host page cache; direct=off caches it.  Checked with fincore."""
import os
import shutil
import subprocess
import harness

if shutil.which("fincore") is None:
    harness.skip("fincore (util-linux) is not installed")

SIZE = 32 << 20
DATA = harness.pattern(SIZE, 9)


def cached_bytes(path):
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def read_all(params):
    image = harness.make_image(SIZE, data=DATA)
    # Written through the page cache: evict it before measuring.
    with open(image, "rb+") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    srv = harness.Server(image, params)
    h = srv.connect()
    if "direct=off" not in params and "O_DIRECT not supported" in srv.log_text():
        harness.skip("this filesystem refuses O_DIRECT")
    for off in range(0, SIZE, 1 << 20):
        assert h.pread(1 << 20, off) == DATA[off:off + (1 << 20)]
    cached = cached_bytes(image)     # at once: nothing else may evict it
    h.shutdown()
    srv.stop()
    return cached


direct = read_all([])
buffered = read_all(["direct=off"])
assert direct < SIZE // 20, f"O_DIRECT read left {direct} bytes cached"
assert buffered > SIZE // 2, f"direct=off cached only {buffered} bytes (test is not measuring)"
print(f"ok: {SIZE >> 20} MiB read: {direct} bytes cached with O_DIRECT, {buffered} with direct=off")
