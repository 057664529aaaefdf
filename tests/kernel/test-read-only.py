"""A read-only attach shows a read-only device that refuses writes, still
reads the image's bytes, and leaves the image unchanged.

Linux 6.1 lets a read-only block device be opened for writing; the write
itself fails (blkdev_write_iter returns EPERM).  Either refusal passes; a
write that succeeds fails the test."""
import errno
import mmap
import os

from kfix import digest, make_image, sysfs

REFUSALS = (errno.EROFS, errno.EPERM, errno.EACCES)
# Hashed twice in Python, which under TCG costs about 0.1 s per MiB: the
# test needs a device, not a large one.
SIZE = 16 << 20


def run_test(kind, cl):
    image = make_image(cl, size=SIZE, fill=1 << 20, seed=5)
    before = digest(image)
    dev = kind.attach(cl, image, read_only=True).device
    assert sysfs(dev, "ro") == "1", f"sysfs ro is {sysfs(dev, 'ro')}, expected 1"
    for flags, what in [(os.O_WRONLY | os.O_DIRECT, "direct"), (os.O_WRONLY, "buffered")]:
        try:
            fd = os.open(dev, flags)
        except OSError as e:
            assert e.errno in REFUSALS, f"open for writing failed with {errno.errorcode[e.errno]}"
            continue
        try:
            buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT wants
            buf.write(b"\xa5" * 4096)
            n = os.pwritev(fd, [buf], 0)
            os.fsync(fd)
        except OSError as e:
            assert e.errno in REFUSALS, f"{what} write failed with {errno.errorcode[e.errno]}"
        else:
            raise AssertionError(f"{what} write of {n} bytes to read-only {dev} succeeded")
        finally:
            os.close(fd)
    fd = os.open(dev, os.O_RDONLY)
    try:
        data = os.pread(fd, 1 << 20, 0)
    finally:
        os.close(fd)
    with open(image, "rb") as f:
        assert data == f.read(1 << 20), "read-only device reads wrong bytes"
    assert digest(image) == before, "the image changed under a read-only attach"
