#!/usr/bin/python3
"""A block device as backing store (a loop device made by the test):
size from BLKGETSIZE64, preferred block size from BLKSSZGET (512 and 4096),
reads and writes, TRIM through BLKDISCARD, zero through BLKZEROOUT, and
no extents (all data)."""
import os
import shutil
import subprocess
import nbd
import harness

if os.geteuid() != 0:
    harness.skip("creating a loop device needs root")
if shutil.which("losetup") is None:
    harness.skip("losetup (util-linux) is not installed")

SIZE = 32 << 20


def loop_device(backing, sector_size):
    p = subprocess.run(["losetup", "--find", "--show", f"--sector-size={sector_size}", backing],
                       capture_output=True, text=True)
    if p.returncode != 0:
        harness.skip(f"losetup failed: {p.stderr.strip()}")
    dev = p.stdout.strip()
    harness.on_exit(lambda: subprocess.run(["losetup", "-d", dev]))
    return dev


for sector in (512, 4096):
    backing = harness.make_image(SIZE, data=harness.pattern(SIZE, sector))
    dev = loop_device(backing, sector)
    srv = harness.Server(dev)
    h = srv.connect()
    assert h.get_size() == SIZE, f"size {h.get_size()}"
    assert h.get_block_size(nbd.SIZE_PREFERRED) == sector, \
        f"preferred block size {h.get_block_size(nbd.SIZE_PREFERRED)} != {sector}"
    mirror = bytearray(harness.pattern(SIZE, sector))
    assert h.pread(SIZE, 0) == bytes(mirror)
    new = harness.pattern(1 << 20, 99)
    h.pwrite(new, 4 << 20)
    mirror[4 << 20:5 << 20] = new
    h.zero(1 << 20, 8 << 20, nbd.CMD_FLAG_NO_HOLE)       # BLKZEROOUT
    mirror[8 << 20:9 << 20] = bytes(1 << 20)
    assert h.pread(SIZE, 0) == bytes(mirror), "after write and zero"
    assert h.can_trim()
    h.trim(1 << 20, 16 << 20)                              # BLKDISCARD
    h.flush()
    # Without extents support, everything is reported as data.
    h.shutdown()
    srv.stop()
    # Bytes not trimmed are intact on the device.
    with open(dev, "rb") as f:
        got = f.read()
    assert got[:16 << 20] == bytes(mirror[:16 << 20]), "device content differs"
    assert got[17 << 20:] == bytes(mirror[17 << 20:]), "device content beside the trim differs"
print("ok: loop devices with 512 and 4096-byte sectors served, zeroed and discarded")
