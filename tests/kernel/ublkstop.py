"""Helpers for the tests of a ublk device's stop (ublk-detach-recovering,
ublk-detach-slow-stop): a detach that meets a dead server."""
import os
import signal
import subprocess
import time

from kfix import wait_until
import kinds
import restart


class HeldWriter:
    """DEVICE held open with DIRTY random bytes written to its page cache
    and not synced: no close of ours writes them back before the stop
    does.  close() lets the device go (its deletion's DEL_DEV waits for
    its last opener)."""

    def __init__(self, cl, device, dirty):
        self.fds = [os.open(device, os.O_RDWR)]
        cl.push(lambda: [os.close(f) for f in self.fds])
        self.data = os.urandom(dirty)
        os.pwrite(self.fds[0], self.data, 0)

    def close(self):
        os.close(self.fds.pop())


def detach_over_dead_server(kind, cl, att, st):
    """Kills ATT's server while its supervisor (from status ST) is held
    (SIGSTOP), begins `mloop detach`, then lets the supervisor go: its
    stop meets a dead server whatever the emulated guest's speed.
    Returns the supervisor's pid and the detach's Popen."""
    supervisor, server = restart.supervisor_of(st), st["device"]["server_pid"]
    os.kill(supervisor, signal.SIGSTOP)
    cl.push(lambda: restart.alive(supervisor) and os.kill(supervisor, signal.SIGCONT))
    restart.sigkill_server(att.device, server)
    wait_until(lambda: not restart.alive(server), f"server pid {server} to die")
    detach = subprocess.Popen([kinds.CLI, "detach", att.device], env=kind.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    cl.push(lambda: detach.poll() is None and detach.kill())
    time.sleep(1)
    os.kill(supervisor, signal.SIGCONT)
    return supervisor, detach


def finish_detach(att, detach, image, writer):
    """Waits for DETACH of ATT, whose device must be gone, and checks
    IMAGE holds what WRITER wrote."""
    name = os.path.basename(att.device)
    wait_until(lambda: not os.path.exists(f"/sys/block/{name}"), f"{att.device} to go", 60)
    writer.close()
    out, err = detach.communicate(timeout=60)
    att.attached = detach.returncode != 0  # else its cleanup has nothing to do
    with open(image, "rb") as f:
        assert f.read(len(writer.data)) == writer.data, \
            "the image lacks what the page cache held when the detach began"
    assert detach.returncode == 0, f"mloop detach: exit {detach.returncode}: {err.strip()}"
