"""Detach leaves nothing behind: no server process, socket, state or
kernel connection."""
import mmap
import os

from kfix import make_image, wait_until


def run_test(kind, cl):
    image = make_image(cl)
    att = kind.attach(cl, image)
    fd = os.open(att.device, os.O_RDWR | os.O_DIRECT)
    try:
        # Some traffic first, so detach has something to flush.
        buf = mmap.mmap(-1, 1 << 16)  # page-aligned, as O_DIRECT wants
        buf.write(os.urandom(len(buf)))
        assert os.pwritev(fd, [buf], 0) == len(buf)
        os.fsync(fd)
    finally:
        os.close(fd)
    att.detach()
    # Servers exit a moment after the kernel lets go.
    problems = []

    def clean():
        problems[:] = kind.leftovers(att, image)
        return not problems
    try:
        wait_until(clean, "detach to finish", timeout=15)
    except AssertionError:
        raise AssertionError("; ".join(problems))
