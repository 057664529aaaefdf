"""A supervisor killed while its stop's recovery attempt is still
starting (the OOM killer, detach's patience) leaves that attempt to come
up on its own: detach must find it in the supervisor's record and tell
it to stop, so that it writes the page cache back, rather than delete
the device under it.  The attempt is held (SIGSTOP, once it has blocked
SIGTERM) while the supervisor is killed, and let go once detach's
SIGTERM waits for it.  About 10 s in the 6.12 guest."""
import os
import signal
import time

from kfix import make_image, wait_until
import restart
import ublkstop

DIRTY = 4 << 20
SIGTERM_BIT = 1 << (signal.SIGTERM - 1)


def status_mask(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def attempt_of(dev):
    """The pid of an mloop-ublk --recover of DEV that has blocked
    SIGTERM (its main has begun), or None."""
    want = f"--recover={dev.removeprefix('/dev/ublkb')}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if want not in f.read().split(b"\0"):
                    continue
        except OSError:
            continue
        if status_mask(pid, "SigBlk") & SIGTERM_BIT:
            return int(pid)
    return None


def run_test(kind, cl):
    image = make_image(cl)
    att = restart.attach(kind, cl, image, 30)
    st = restart.status(kind, att.device)
    writer = ublkstop.HeldWriter(cl, att.device, DIRTY)
    supervisor, detach = ublkstop.detach_over_dead_server(kind, cl, att, st)

    deadline = time.monotonic() + 30
    while (attempt := attempt_of(att.device)) is None:
        assert time.monotonic() < deadline, "no recovery attempt for the stop"
        time.sleep(0.005)
    os.kill(attempt, signal.SIGSTOP)
    cl.push(lambda: restart.alive(attempt) and os.kill(attempt, signal.SIGCONT))
    os.kill(supervisor, signal.SIGKILL)
    try:
        wait_until(lambda: status_mask(attempt, "ShdPnd") & SIGTERM_BIT
                   or status_mask(attempt, "SigPnd") & SIGTERM_BIT,
                   f"detach to tell the orphaned attempt pid {attempt} to stop", 15)
    finally:
        os.kill(attempt, signal.SIGCONT)
    ublkstop.finish_detach(att, detach, image, writer)
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
