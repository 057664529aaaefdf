"""A server that cannot come back (its image is gone) makes the device
fail reads with EIO once the dead-connection timeout passes, instead of
hanging; mloop status names the failure, and detach still cleans up.
(A ublk device is stopped then, so it is opened before the kill, as a
mounted filesystem holds it.)"""
import os

from kfix import make_image, wait_until
from restart import attach, read_fails_eio, sigkill_server, status

TIMEOUT = 5  # request and dead-connection timeout for this device


def run_test(kind, cl):
    image = make_image(cl, fill=1 << 20)
    att = attach(kind, cl, image, TIMEOUT)
    s = status(kind, att.device)
    fd = os.open(att.device, os.O_RDONLY | os.O_DIRECT)
    os.unlink(image)                 # every restart will fail to open it
    sigkill_server(att.device, s["device"]["server_pid"])
    wait_until(lambda: status(kind, att.device)["last_failure"] is not None and
               "No such file" in (status(kind, att.device)["last_failure"] or ""),
               "the supervisor to report the missing image", timeout=60)

    try:
        took = read_fails_eio(fd, "a device without a server")
    finally:
        os.close(fd)
    # Dead-connection timeout, plus slack for the emulated guest.
    assert took < TIMEOUT + 30, f"the read hung {took:.0f} s before failing"
    att.detach()
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
