"""Right after `mloop attach`, the kernel reads the replies of every
connection of the device, even when its worker pool must create kworkers
for them on a busy machine.

On Linux 6.1, when creating a kworker takes longer than 10 ms, the nbd
receive workqueue's rescuer takes every pending receive work and runs
only the first, so every other connection of that device goes unread and
each request sent on it waits for the request timeout (recvwork.py).
mloop attach checks that every connection's receive work runs and, if
not, connects the device again (lib/nbd_receivers.h); each try leaves
the pool a kworker or two richer.  Here eight busy loops keep the guest's
CPUs busy while three devices of 10 connections are attached one after
another: after the warm-up the pool holds about 13 idle kworkers, so the
later devices need new ones.  Measured on 6.1: without the check the
second device had 8 of 10 connections read; with it, every device had
all 10 after up to 6 tries."""
import signal
import subprocess

import recvwork
from kfix import make_image, nbd_in_use, wait_until

CONNECTIONS = 10
DEVICES = 3
BUSY_LOOPS = 8


def run_test(kind, cl):
    images = [make_image(cl, seed=i) for i in range(DEVICES)]
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"])
            for _ in range(BUSY_LOOPS)]

    def stop_busy():
        for p in busy:
            p.send_signal(signal.SIGKILL)
            p.wait()
    cl.push(stop_busy)

    for img in images:
        args = kind.attach_args(img)
        args[args.index("--connections") + 1] = str(CONNECTIONS)
        dev = kind.cli(*args).stdout.strip()
        cl.push(detach, kind, dev)
        # A starved connection never gets its reader (6.1's rescuer runs
        # the first receive work for as long as it lives); 10 s leaves
        # time for 6.12 to create kworkers on a busy TCG guest.
        reason = recvwork.starved(dev, CONNECTIONS, timeout=10)
        assert reason is None, reason
    stop_busy()


def detach(kind, dev):
    kind.cli("detach", dev)
    wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")
