"""An idle nbd device someone holds open is never connected again while
held, and costs no one else an attach.  A user may hold open the node
of every device they were given (a descriptor opened while the node was
theirs outlives the detach).  Opened, an idle device gets a
configuration, so the kernel's status calls it connected: attach never
picks it (nor gives its node back to root while it is held), and the
kernel, choosing, skips it.  Here every idle device is held open, at
least 17 of them (one more is made by an attach and held after its
detach: more than attach would try of devices another attach took
first), and an attach still gets a device, none of those held.  About
3-5 s."""
import os

from kfix import make_image, nbd_in_use, wait_until

# More than attach ever gave up after.
HELD = 17


def idle_devices():
    names = [n for n in os.listdir("/sys/block") if n.startswith("nbd")]
    return sorted(f"/dev/{n}" for n in names if not nbd_in_use(f"/dev/{n}"))


def run_test(kind, cl):
    image = make_image(cl)
    held = {}

    def close_all():
        for fd in held.values():
            os.close(fd)
    cl.push(close_all)

    def hold(dev):
        if dev not in held:
            held[dev] = os.open(dev, os.O_RDONLY)

    def attach():
        p = kind.cli(*kind.attach_args(image), check=False)
        assert p.returncode == 0, \
            f"attach with {len(held)} idle devices held open: {p.stderr.strip()}"
        return p.stdout.strip()

    def detach(dev):
        kind.cli("detach", dev)
        wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")

    for dev in idle_devices():
        hold(dev)
    while len(held) < HELD:
        dev = attach()
        detach(dev)
        hold(dev)
    dev = attach()
    assert dev not in held, f"{dev} was held open, yet connected"
    detach(dev)
