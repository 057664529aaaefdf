"""A remote device survives its server's restarts: `mloop serve` (this
kind's server) on 127.0.0.1 over TCP, attached with four connections;
fio writes random blocks with crc32c verification while the `mloop serve`
process is killed with SIGKILL and started again on the same port three
times, down for a second or two each time.  The device's supervisor
reconnects it each time: fio sees no IO error and no verify mismatch, the
kernel logs no I/O error for the device, and detach leaves no process.

Then a server down for longer than the device's dead-connection timeout
(--dead-timeout, short here): IO fails with EIO instead of hanging, the
device is reconnected once the server is back, and it detaches cleanly."""
import os
import signal
import socket
import subprocess
import time

from kfix import CONNECTIONS, make_image, run, sysfs, wait_until
import fioverify
import kinds

KILLS = 3
DOWN = 1.5          # seconds each server stays dead
REQUEST_TIMEOUT = 10  # requests in flight on a killed server come back after it
DEAD_TIMEOUT = 5    # the second part's: shorter than its outage
RECONNECT_LIMIT = 60  # seconds from a server's restart to a reconnected device


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Remote:
    """`mloop serve` of IMAGE on 127.0.0.1:PORT, in a session of its own so
    that it and anything it started die together."""

    def __init__(self, kind, cl, image):
        self.kind, self.image, self.port, self.proc = kind, image, free_port(), None
        cl.push(self.stop)

    def start(self):
        self.proc = subprocess.Popen(
            [kinds.CLI, "serve", self.image, "--listen", f"tcp:127.0.0.1:{self.port}",
             "--export-name", "disk", "--server", self.kind.server],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=self.kind.env(), start_new_session=True)

        def listening():
            assert self.proc.poll() is None, \
                f"mloop serve exited: {self.proc.stderr.read()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(listening, "mloop serve to listen", timeout=60)

    def kill(self, dev):
        """SIGKILLs the server, marking it in the kernel log first: requests
        it held come back only through the request timeout, so the kernel
        log check forgives "Connection timed out" for that long."""
        with open("/dev/kmsg", "w") as f:
            f.write(f"<4>mloop-ktest-kill: {dev} server {self.proc.pid}, "
                    f"request timeout {REQUEST_TIMEOUT} s\n")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)

    @property
    def uri(self):
        return f"nbd://127.0.0.1:{self.port}/disk"


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (FileNotFoundError, IndexError):
        return False


class KernelLog:
    """The kernel log's records from now on."""

    def __init__(self):
        self.fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(self.fd, 0, os.SEEK_END)

    def read(self):
        lines = []
        while True:
            try:
                rec = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # records were overwritten: go on
                continue
            if not rec:
                break
            lines.append(rec.decode(errors="replace").split(";", 1)[-1].strip())
        return lines

    def close(self):
        os.close(self.fd)


def attach(kind, cl, remote, *extra):
    p = kind.cli("attach", remote.uri, "--connections", str(CONNECTIONS),
                 "--timeout", str(REQUEST_TIMEOUT), *extra)
    dev = p.stdout.strip()

    def undo():
        if sysfs(dev, "pid") is not None or sysfs(dev, "size") not in ("0", None):
            kind.cli("detach", dev)
    cl.push(undo)
    kind.assert_kept(dev)
    return dev, kind.status(dev)


def detach_clean(kind, dev):
    pid = kind.status(dev)["supervisor_pid"]
    kind.cli("detach", dev)
    wait_until(lambda: sysfs(dev, "pid") is None, f"{dev} to disconnect")
    wait_until(lambda: not alive(pid), f"supervisor pid {pid} to exit", timeout=15)
    left = kind.state_entries()
    assert not left, f"detach left {left} in the runtime dir"


def wait_reconnected(kind, dev, before, what):
    wait_until(lambda: kind.status(dev)["reconnects"] >= before + CONNECTIONS,
               f"{dev}'s supervisor to reconnect every connection ({what})",
               RECONNECT_LIMIT)


def survives_restarts(kind, cl, remote):
    dev, _ = attach(kind, cl, remote)
    klog = KernelLog()
    cl.push(klog.close)

    def kill_once():
        before = kind.status(dev)["reconnects"]
        remote.kill(dev)
        time.sleep(DOWN)
        remote.start()
        start = time.monotonic()
        wait_reconnected(kind, dev, before, "after a restart")
        return time.monotonic() - start

    took, rounds = fioverify.under_kills(dev, cl, KILLS, kill_once)
    name = os.path.basename(dev)
    errors = [line for line in klog.read() if "I/O error" in line and name in line]
    assert not errors, f"the kernel failed requests: {errors[:5]}"
    st = kind.status(dev)
    assert st["reconnects"] >= KILLS, f"the supervisor recorded {st['reconnects']} reconnects"
    queues = len(os.listdir(f"/sys/block/{name}/mq"))
    assert queues == CONNECTIONS, f"{dev} has {queues} hardware queues after the restarts"
    # One line per outage for a failure streak, not one per try.
    with open(os.path.join(os.path.dirname(st["device"]["socket"]), "supervisor.log")) as f:
        log = f.read().splitlines()
    said = [line for line in log if "cannot reconnect" in line]
    assert len(said) <= KILLS, f"the supervisor logged {len(said)} failures for " \
        f"{KILLS} outages: {said[:10]}"
    for line in kind.cli("status", dev).stdout.splitlines():
        print(f"# status: {line}", flush=True)
    print(f"# {st['reconnects']} connections reconnected; each restart's took "
          f"{', '.join('%.1f s' % t for t in took)} ({rounds} fio round(s))", flush=True)
    detach_clean(kind, dev)


def fails_past_dead_timeout(kind, cl, remote):
    dev, st = attach(kind, cl, remote, "--dead-timeout", str(DEAD_TIMEOUT))
    assert st["device"]["dead_timeout"] == DEAD_TIMEOUT, st["device"]
    before = st["reconnects"]
    remote.kill(dev)
    time.sleep(2)  # every connection's receive has failed: all slots dead
    start = time.monotonic()
    p = run(["dd", f"if={dev}", "of=/dev/null", "bs=4k", "count=1", "iflag=direct"],
            check=False, timeout=120)
    took = time.monotonic() - start
    assert p.returncode != 0, f"a read of {dev} succeeded with its server down"
    assert "Input/output error" in p.stderr, f"dd: {p.stderr.strip()}"
    st = kind.status(dev)
    assert st["supervisor_running"] and st["last_failure"], \
        f"the supervisor does not say why it cannot reconnect: {st}"
    print(f"# with the server down, a read failed with EIO after {took:.1f} s "
          f"(dead timeout {DEAD_TIMEOUT} s); supervisor: {st['last_failure']}", flush=True)
    # The export comes back: the device serves again.
    remote.start()
    wait_reconnected(kind, dev, before, "after the dead timeout")
    run(["dd", f"if={dev}", "of=/dev/null", "bs=4k", "count=1", "iflag=direct"],
        timeout=120)
    remote.kill(dev)
    time.sleep(1)
    detach_clean(kind, dev)


def run_test(kind, cl):
    image = make_image(cl)
    remote = Remote(kind, cl, image)
    remote.start()
    survives_restarts(kind, cl, remote)
    fails_past_dead_timeout(kind, cl, remote)
