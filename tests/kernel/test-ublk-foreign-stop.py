"""mloop-ublk stopped by a SIGTERM from someone other than its
supervisor (an administrator's kill, a shutdown) still writes its
device's page cache back before the stop, which with user recovery
skips the kernel's own write-back: what a buffered writer wrote without
an fsync reaches the image.  About 3 s in the 6.12 guest."""
import hashlib
import os
import signal
import time

from kfix import make_image, wait_until
import restart

DIRTY = 4 << 20


def run_test(kind, cl):
    image = make_image(cl)
    att = restart.attach(kind, cl, image, 30)
    server = restart.status(kind, att.device)["device"]["server_pid"]
    name = os.path.basename(att.device)

    # Held open, so that no close of ours writes the page cache back.
    fd = os.open(att.device, os.O_RDWR)
    held = [fd]
    cl.push(lambda: [os.close(f) for f in held])
    data = os.urandom(DIRTY)
    os.pwrite(fd, data, 0)

    start = time.monotonic()
    os.kill(server, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(f"/sys/block/{name}"),
               f"{att.device} to be deleted by its stopped server")
    print(f"# {att.device} deleted {time.monotonic() - start:.1f} s after the SIGTERM",
          flush=True)
    # The server's DEL_DEV waits for the disk's last opener.
    os.close(held.pop())
    with open(image, "rb") as f:
        got = f.read(DIRTY)
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), \
        "the image lacks what the page cache held when mloop-ublk was told to stop"

    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
