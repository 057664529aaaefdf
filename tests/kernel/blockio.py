"""Block-level IO for the fault tests (failing disk, stalled disk): blocks
that name their offset and write generation, filling a region, fio verify
of a region, and the kernel log after a mark the test wrote."""
import json
import mmap
import os
import struct

from kfix import run, tmpdir

BLOCK = 4096


def pattern(offset, gen):
    """The 4 KiB a block at OFFSET holds after its GEN-th write: names both,
    so data at the wrong place or from the wrong write cannot match."""
    return struct.pack("<QQ", offset, gen) * (BLOCK // 16)


def fill(dev, start, end):
    """Writes pattern(offset, 0) to every block of [START, END) of DEV with
    O_DIRECT, 1 MiB at a time, and syncs."""
    chunk = 1 << 20
    buf = mmap.mmap(-1, chunk)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT)
    try:
        for base in range(start, end, chunk):
            buf.seek(0)
            for off in range(base, base + chunk, BLOCK):
                buf.write(pattern(off, 0))
            assert os.pwrite(fd, buf, base) == chunk
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


def odirect_block(dev, offset, data=None):
    """Writes DATA (one block) at OFFSET of DEV with O_DIRECT, or reads
    one block there."""
    buf = mmap.mmap(-1, BLOCK)
    fd = os.open(dev, (os.O_RDWR if data else os.O_RDONLY) | os.O_DIRECT)
    try:
        if data:
            buf.write(data)
            assert os.pwrite(fd, buf, offset) == BLOCK
            os.fsync(fd)
            return None
        assert os.preadv(fd, [buf], offset) == BLOCK
        return bytes(buf)
    finally:
        os.close(fd)
        buf.close()


def write_errno(dev, offset, data, dsync=False):
    """Writes DATA at OFFSET of DEV with O_DIRECT (and O_DSYNC: a FUA
    request); returns the errno it failed with, or 0."""
    buf = mmap.mmap(-1, len(data))
    buf.write(data)
    fd = os.open(dev, os.O_WRONLY | os.O_DIRECT | (os.O_DSYNC if dsync else 0))
    try:
        os.pwrite(fd, buf, offset)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
        buf.close()


def sync_errno(path):
    """fsync of PATH on a descriptor of its own (a device's: a FLUSH
    request): 0 or its errno."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def kernel_log_around(token):
    """The kernel log before and after the line holding TOKEN (a mark the
    test wrote to /dev/kmsg)."""
    lines = run(["dmesg"]).stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if token in line]
    assert marks, "the test's mark is no longer in the kernel log"
    return lines[:marks[-1]], lines[marks[-1] + 1:]


def fio_verify(cl, dev, name, offset, region, jobs):
    """fio writes JOBS regions of REGION bytes from OFFSET of DEV (4 KiB
    random writes, QD16, O_DIRECT) and verifies them (crc32c)."""
    p = run(["fio", f"--name={name}", f"--filename={dev}", "--ioengine=libaio",
             "--direct=1", "--rw=randwrite", "--bs=4k", "--iodepth=16",
             f"--numjobs={jobs}", f"--size={region}", f"--offset={offset}",
             f"--offset_increment={region}", "--verify=crc32c", "--verify_fatal=1",
             "--verify_state_save=0", "--output-format=json"], check=False, cwd=tmpdir(cl))
    assert p.returncode == 0, f"fio exit {p.returncode}: {p.stderr.strip()[-2000:]}"
    assert "verify" not in p.stderr, f"fio reported: {p.stderr.strip()[-2000:]}"
    for j in json.loads(p.stdout[p.stdout.index("{"):])["jobs"]:
        assert j["error"] == 0, f"fio job {j['jobname']} error {j['error']}"
        assert j["write"]["io_bytes"] == region and j["read"]["io_bytes"] == region, \
            f"fio wrote {j['write']['io_bytes']} and verified {j['read']['io_bytes']} bytes"
