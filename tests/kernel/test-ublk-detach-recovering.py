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
import subprocess
import time

from kfix import make_image, wait_until
import kinds
import restart

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
    supervisor, server = restart.supervisor_of(st), st["device"]["server_pid"]
    name = os.path.basename(att.device)

    held = [os.open(att.device, os.O_RDWR)]
    cl.push(lambda: [os.close(f) for f in held])
    data = os.urandom(DIRTY)
    os.pwrite(held[0], data, 0)

    os.kill(supervisor, signal.SIGSTOP)
    cl.push(lambda: restart.alive(supervisor) and os.kill(supervisor, signal.SIGCONT))
    restart.sigkill_server(att.device, server)
    wait_until(lambda: not restart.alive(server), f"server pid {server} to die")
    detach = subprocess.Popen([kinds.CLI, "detach", att.device], env=kind.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: detach.poll() is None and detach.kill())
    time.sleep(1)
    os.kill(supervisor, signal.SIGCONT)
    # A second SIGTERM during the stop's recovery (an impatient admin, a
    # shutdown's kill round) must not end the stop half way.
    wait_until(lambda: recovering(att.device) or not os.path.exists(f"/sys/block/{name}"),
               "the stop to start a recovery")
    os.kill(supervisor, signal.SIGTERM)
    wait_until(lambda: not os.path.exists(f"/sys/block/{name}"), f"{att.device} to go", 60)
    # The device's deletion waits for its last opener.
    os.close(held.pop())
    out, err = detach.communicate(timeout=60)
    att.attached = detach.returncode != 0  # else its cleanup has nothing to do
    assert detach.returncode == 0, f"mloop detach: exit {detach.returncode}: {err.strip()}"
    with open(image, "rb") as f:
        assert f.read(DIRTY) == data, \
            "the image lacks what the page cache held when the detach began"
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
