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
import subprocess
import time

from kfix import make_image, wait_until
import kinds
import restart

DIRTY = 64 << 20


def run_test(kind, cl):
    image = make_image(cl, size=128 << 20)
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
    wait_until(lambda: not os.path.exists(f"/sys/block/{name}"), f"{att.device} to go", 60)
    os.close(held.pop())
    out, err = detach.communicate(timeout=60)
    att.attached = detach.returncode != 0
    with open(image, "rb") as f:
        assert f.read(DIRTY) == data, \
            "the image lacks what the page cache held: the recovered server was not " \
            "stopped by detach (which writes it back)"
    assert detach.returncode == 0, f"mloop detach: exit {detach.returncode}: {err.strip()}"
    left = kind.leftovers(att, image)
    assert not left, "; ".join(left)
