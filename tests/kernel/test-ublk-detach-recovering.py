"""A detach that comes while the device's server is dead and its
recovery not yet serving still writes the device's page cache back:
the supervisor's stop recovers the device once, flushes it, and only
then stops it.  Deleting it instead would drop what a buffered writer
wrote without an fsync.  The supervisor is held (SIGSTOP) while its
server is killed and the detach begins, so the stop meets a dead
server whatever the emulated guest's speed; a second SIGTERM comes
while the stop recovers.  About 5 s in the 6.12 guest."""
import os
import signal

from kfix import make_image, wait_until
import restart
import ublkstop

DIRTY = 4 << 20


def recovering(dev):
    """Whether an mloop-ublk --recover of DEV runs."""
    want = f"--recover={dev.removeprefix('/dev/ublkb')}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if want in f.read().split(b"\0"):
                    return True
        except OSError:
            continue
    return False


def run_test(kind, cl):
    image = make_image(cl)
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    name = os.path.basename(att.device)
    writer = ublkstop.HeldWriter(cl, att.device, DIRTY)
    supervisor, detach = ublkstop.detach_over_dead_server(kind, cl, att, st)
    # A second SIGTERM during the stop's recovery (an impatient admin, a
    # shutdown's kill round) must not end the stop half way.
    wait_until(lambda: recovering(att.device) or not os.path.exists(f"/sys/block/{name}"),
               "the stop to start a recovery")
    os.kill(supervisor, signal.SIGTERM)
    ublkstop.finish_detach(att, detach, image, writer)
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
