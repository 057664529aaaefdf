"""A detach whose supervisor's stop outlasts detach's patience (30 s)
still stops the server that stop recovered, so that it writes the page
cache back.  The supervisor's server is killed while the supervisor is
held (SIGSTOP) and a detach begins; the stop recovers the device, and
the recovered server is held in turn during the stop's flush, until
detach has SIGKILLed the supervisor.  Detach must then SIGTERM the
server the supervisor recorded last, not the dead one its state named
when it began: the image holds what the page cache held.  About 45 s
in the 6.12 guest (detach's 30 s patience): full tier."""
import os
import signal
import time

from kfix import make_image, wait_until
import restart
import ublkstop

DIRTY = 64 << 20


def run_test(kind, cl):
    image = make_image(cl, size=128 << 20)
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    writer = ublkstop.HeldWriter(cl, att.device, DIRTY)
    supervisor, detach = ublkstop.detach_over_dead_server(kind, cl, att, st)

    def recovered():
        for line in restart.supervisor_log(st):
            if "again, for its stop's write-back" in line:
                return int(line.split("mloop-ublk pid ")[1].split()[0])
        return None
    deadline = time.monotonic() + 30
    while (again := recovered()) is None:
        assert time.monotonic() < deadline, \
            f"no recovery for the stop; supervisor.log: {restart.supervisor_log(st)[-6:]}"
        time.sleep(0.01)
    os.kill(again, signal.SIGSTOP)
    cl.push(lambda: restart.alive(again) and os.kill(again, signal.SIGCONT))
    # Detach's patience with the supervisor ends in a SIGKILL; its flush
    # thread may keep the process until the writeback ends, but its
    # main thread is gone.
    wait_until(lambda: not restart.alive(supervisor), "detach to kill the held stop", 60)
    os.kill(again, signal.SIGCONT)
    ublkstop.finish_detach(att, detach, image, writer)
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
