"""What the guest halves of the device benchmarks share
(bench/attach_guest.py, bench/many_guest.py): the kinds of block device
they make, each with attach(image) -> (device path, what the command
said on stderr) and detach(device)."""
import atexit
import os
import resource
import shutil
import socket
import subprocess
import time

CLI = os.environ.get("MLOOP_CLI", "")
MLOOPD = os.environ.get("MLOOPD_BIN", "")


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


class LoopDio:
    name = "loop-dio"

    def resident(self):
        """Pids of the long-lived processes the kind's attaches ask
        (started before them, yet holding their devices)."""
        return []

    def unavailable(self):
        return None if shutil.which("losetup") else "losetup is not installed"

    def attach(self, image):
        p = run(["losetup", "--find", "--show", "--direct-io=on", image])
        return p.stdout.strip(), p.stderr

    def detach(self, dev):
        run(["losetup", "--detach", dev])


class Mloop:
    """mloop attach with ARGS, in a runtime directory of its own."""

    def __init__(self, name, args):
        self.name, self.args = name, args
        self.env = dict(os.environ, MLOOP_RUNTIME_DIR=f"/run/mloop-bench-{os.getpid()}")

    def unavailable(self):
        if not CLI or not os.path.exists(CLI):
            return "build/client/mloop not built"
        if "ublk" in self.args and not os.path.exists("/dev/ublk-control"):
            return "the kernel has no ublk_drv"
        return None

    def attach(self, image):
        p = run([CLI, "attach", *self.args, image], env=self.env)
        return p.stdout.strip(), p.stderr

    def detach(self, dev):
        run([CLI, "detach", dev], env=self.env)

    def resident(self):
        return []


def systemd_limits():
    """The descriptor limit systemd gives a service (its default
    LimitNOFILE=1024:524288), which mloopd raises its soft limit to: the
    guest's init leaves its children 4,096 at most, and mloopd serving
    inside itself holds about 35 descriptors per device."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 524288))


class MloopService(Mloop):
    """mloop attach where mloopd listens: mloopd keeps each device's
    server, and no supervisor is started per device.  mloopd starts
    with the first attach, as its socket would start it."""

    def __init__(self, name, args, options=()):
        super().__init__(name, args)
        self.env["MLOOP_RUNTIME_DIR"] += "-" + name
        self.options = list(options)
        self.mloopd = None

    def unavailable(self):
        if not MLOOPD or not os.path.exists(MLOOPD):
            return "build/supervisor/mloopd not built"
        return super().unavailable()

    def _start_mloopd(self):
        sock = os.path.join(self.env["MLOOP_RUNTIME_DIR"], "mloopd.sock")
        self.mloopd = subprocess.Popen([MLOOPD] + self.options, env=self.env, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, preexec_fn=systemd_limits)
        atexit.register(lambda: self.mloopd.poll() is None and self.mloopd.terminate())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                    s.connect(sock)
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mloopd did not listen")

    def attach(self, image):
        if self.mloopd is None:
            self._start_mloopd()
        return super().attach(image)

    def resident(self):
        return [self.mloopd.pid] if self.mloopd else []


def kinds(verbose=False):
    """Every kind, by name; VERBOSE: mloop says what each step of an
    attach took."""
    v = ["--verbose"] if verbose else []
    return {k.name: k for k in (LoopDio(), Mloop("mloop-native", [*v, "--server", "native"]),
                                MloopService("mloop-service",
                                             [*v, "--server", "native"]),
                                MloopService("mloop-in-process",
                                             [*v, "--server", "native"],
                                             ["--serve=in-process"]),
                                Mloop("mloop-ublk", [*v, "--transport", "ublk"]))}
