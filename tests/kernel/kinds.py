"""The ways the kernel tests attach an image to a block device ("kinds"),
each with the same small interface, so every test runs unchanged through
each of them:

  native, nbdkit       `mloop attach --server native|nbdkit` (the CLI)
  service              `mloop attach --server native` with mloopd listening:
                       one resident mloopd keeps every device's server
  ublk                 `mloop attach --transport ublk`: /dev/ublkbN served by
                       mloop-ublk through the kernel's ublk driver (6.12)
  nbd-client-native    stock nbd-client against mloop-server
  nbd-client-nbdkit    stock nbd-client against nbdkit + the mloop plugin
  loop                 the kernel loop driver with direct I/O: the reference
                       for how a block device over a file should behave

A kind has .queues and .block_size (what the attached device must show),
.unavailable() (a skip reason or None; a kind that needs a kernel module
names it in .kernel_module: run-kernel-tests checks the VM's kernel has
it before booting, runner.py that the running kernel has it loaded), .attach(cl, image, read_only)
returning an Attachment whose detach is pushed on the cleanup stack CL, and
.leftovers(att) listing what a detach left behind.
"""
import contextlib
import json
import os
import re
import signal
import shutil
import subprocess

from kfix import (BLOCK_SIZE, CONNECTIONS, DEVICE_TIMEOUT,
                  free_nbd, nbd_in_use, processes_mentioning, run, sysfs,
                  tmpdir, wait_until)
import recvwork
from service import MLOOPD, Service

SERVER_BIN = os.environ.get("MLOOP_SERVER_BIN", "")
UBLK_BIN = os.environ.get("MLOOP_UBLK_BIN", "")
PLUGIN = os.environ.get("MLOOP_PLUGIN", "")
CLI = os.environ.get("MLOOP_CLI", "")


class Attachment:
    """An attached DEVICE; detach() is idempotent so both a test and its
    cleanup may call it."""

    def __init__(self, device, undo):
        self.device = device
        self._undo = undo
        self.attached = True

    def detach(self):
        if self.attached:
            self.attached = False
            self._undo()


def _attach(cl, device, undo, connections=None):
    """Registers DEVICE's detach with CL; with CONNECTIONS (an nbd device)
    first checks the kernel reads the replies of every connection."""
    att = Attachment(device, undo)
    cl.push(att.detach)
    if connections:
        reason = recvwork.starved(device, connections)
        assert reason is None, reason
    return att


def _nbd_leftovers(dev):
    problems = []
    if sysfs(dev, "pid") is not None:
        problems.append(f"{dev} still has a pid in sysfs")
    if sysfs(dev, "size") not in ("0", None):
        problems.append(f"{dev} still has size {sysfs(dev, 'size')}")
    return problems


def _wait_nbd_idle(dev):
    wait_until(lambda: not nbd_in_use(dev), f"{dev} to disconnect")


class MloopCli:
    """`mloop attach` with one of its servers.  State goes to a private
    runtime directory (MLOOP_RUNTIME_DIR) so tests can check it is emptied
    and never touch a real /run/mloop."""

    queues = CONNECTIONS
    block_size = BLOCK_SIZE

    def __init__(self, server):
        self.server = server
        self.name = server
        self.runtime_dir = None

    def unavailable(self):
        if not CLI or not os.path.exists(CLI):
            return "build/client/mloop not built"
        if self.server == "nbdkit" and shutil.which("nbdkit") is None:
            return "nbdkit is not installed"
        return None

    def env(self):
        if self.runtime_dir is None:
            # mloop creates it (0700) on first use.
            self.runtime_dir = os.path.join("/run", f"mloop-ktest-{os.getpid()}")
        return dict(os.environ, MLOOP_RUNTIME_DIR=self.runtime_dir)

    def state_entries(self):
        """What the runtime dir holds besides .lock and mloopd.lock, which
        stay by design (device/device_state.h: the flock()ed file
        serialising attach and detach; the one an mloopd that ran there
        held); per-device state must not stay."""
        if self.runtime_dir is None:  # nothing attached yet (os.listdir(None) is ".")
            return []
        try:
            return sorted(set(os.listdir(self.runtime_dir)) - {".lock", "mloopd.lock"})
        except FileNotFoundError:
            return []

    def cli(self, *args, check=True):
        return run([CLI, *args], check=check, env=self.env())

    @contextlib.contextmanager
    def server_environment(self, extra):
        """The environment for `mloop attach` in which the servers it
        starts see EXTRA too (a dict: a server or plugin of the test's)."""
        yield dict(self.env(), **extra)

    def status(self, dev):
        """`mloop status --json DEV`, parsed."""
        return json.loads(self.cli("status", "--json", dev).stdout)

    def assert_kept(self, dev):
        """Fails unless DEV is kept as this kind keeps devices: here by
        a supervisor of its own."""
        s = self.status(dev)
        assert s["supervisor_running"] and s["supervisor_pid"] > 0 and \
            not s["service_kept"], f"{dev} is not kept by a supervisor of its own: {s}"

    def assert_same_server(self, dev, before, after):
        """Fails unless AFTER (a status()) shows the server of BEFORE still
        serving DEV: the same pid, running, not restarted by the
        supervisor, every connection open."""
        pid, now = before["device"]["server_pid"], after["device"]["server_pid"]
        assert now == pid and after["server_running"], \
            f"{dev}: server pid {pid} became {now} (running: {after['server_running']})"
        assert after["restarts"] == before["restarts"], \
            f"{dev}: the supervisor restarted the server: {after.get('last_failure')}"
        assert after.get("connections_open") == self.queues, \
            f"{dev}: {after.get('connections_open')} of {self.queues} connections open"

    def attach_args(self, image, read_only=False):
        args = ["attach", image, "--connections", str(CONNECTIONS), "--threads", "4",
                "--block-size", str(BLOCK_SIZE), "--timeout", str(DEVICE_TIMEOUT),
                "--server", self.server]
        return args + (["--read-only"] if read_only else [])

    def attach(self, cl, image, read_only=False, args=None):
        """Attaches IMAGE with the options every test uses, or with ARGS
        (from attach_args, amended) when given."""
        p = self.cli(*(args or self.attach_args(image, read_only)))
        lines = p.stdout.splitlines()
        assert len(lines) == 1 and re.fullmatch(r"/dev/nbd\d+", lines[0]), \
            f"mloop attach printed {p.stdout!r}, expected one /dev/nbdN line"
        dev = lines[0]
        assert nbd_in_use(dev), f"mloop attach printed {dev}, which is not connected"

        def undo():
            self.cli("detach", dev)
            _wait_nbd_idle(dev)
        return _attach(cl, dev, undo, self.queues)

    def leftovers(self, att, image):
        return _nbd_leftovers(att.device) + self.process_and_state_leftovers(image)

    def process_and_state_leftovers(self, image):
        """Processes still serving IMAGE, and what the runtime dir still
        holds."""
        problems = [f"process {pid} still serves the image: {cmdline}"
                    for pid, cmdline in processes_mentioning(image)]
        left = self.state_entries()
        if left:
            problems.append(f"runtime dir still holds {left}")
        return problems


class MloopService(MloopCli):
    """`mloop attach --server native` while mloopd listens in the runtime
    directory, as where its socket unit is enabled: mloopd keeps every
    device's server and no mloop-supervisor runs.  One mloopd serves the
    whole group (begin() to end()); after each test it must still run and
    keep nothing."""

    # mloopd's options: where it serves (MloopServiceInProcess).
    options = ()

    def __init__(self, name="service"):
        super().__init__("native")
        self.name = name
        self.service = None

    def unavailable(self):
        reason = super().unavailable()
        if reason:
            return reason
        if not MLOOPD or not os.path.exists(MLOOPD):
            return "mloopd is not built"
        return None

    def begin(self):
        self.env()  # names the runtime directory mloopd listens in
        os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
        self.service = Service(self, os.path.join("/tmp", f"mloopd-{os.getpid()}.log"),
                               self.options)
        self.service.start()

    def end(self):
        self.service.stop()
        os.unlink(self.service.log)

    @contextlib.contextmanager
    def server_environment(self, extra):
        """The servers are mloopd's children: mloopd itself runs with
        EXTRA meanwhile."""
        self.service.stop()
        self.service.start(extra)
        try:
            yield dict(self.env(), **extra)
        finally:
            self.service.stop()
            self.service.start()

    def between(self):
        """What is wrong with mloopd after a test: ended, or still keeping
        a device; None when it serves on, empty.  What it still keeps is
        detached, so that the next test starts clean."""
        if not self.service.running():
            problem = f"mloopd ended (exit {self.service.proc.returncode}): {self.log_tail()}"
            self.service.start()
            return problem
        kept = self.service.kept()
        if kept:
            self.cli("detach", "--all", check=False)
            return f"mloopd still keeps {sorted(kept)}"
        return None

    def log_tail(self):
        with open(self.service.log, errors="replace") as f:
            return " | ".join(f.read().splitlines()[-5:])

    def state_entries(self):
        return [e for e in super().state_entries()
                if e != "mloopd.sock"]

    def attach(self, cl, image, read_only=False, args=None):
        att = super().attach(cl, image, read_only, args)
        self.assert_kept(att.device)
        return att

    def assert_kept(self, dev):
        """Fails unless mloopd keeps DEV, with no supervisor."""
        s = self.status(dev)
        assert s["service_kept"] and s["supervisor_running"] and s["supervisor_pid"] == 0, \
            f"{dev} is not kept by mloopd: {s}"


class MloopServiceInProcess(MloopService):
    """The service kind with mloopd --serve=in-process: every device's
    server inside mloopd, no process per device."""

    options = ("--serve=in-process",)

    def __init__(self):
        super().__init__("in-process")

    def assert_kept(self, dev):
        super().assert_kept(dev)
        s = self.status(dev)
        # Only the native server is served inside: nbdkit stays a program,
        # and a remote export's device has no server of ours.
        assert s["device"]["server_in_process"] or s["device"]["server"] != "native", \
            f"{dev} is not served inside mloopd: {s}"


class MloopUblk(MloopCli):
    """`mloop attach --transport ublk`: no server socket; mloop-ublk creates
    /dev/ublkbN with one hardware queue per --connections and deletes it
    on detach."""

    kernel_module = "ublk_drv"

    def __init__(self):
        super().__init__("ublk")

    def unavailable(self):
        reason = super().unavailable()
        if reason:
            return reason
        if not UBLK_BIN or not os.path.exists(UBLK_BIN):
            return "mloop-ublk is not built (liburing-dev is missing)"
        return None

    def env(self):
        return dict(super().env(), MLOOP_UBLK_BIN=UBLK_BIN)

    def attach_args(self, image, read_only=False):
        args = ["attach", image, "--transport", "ublk", "--connections", str(CONNECTIONS),
                "--block-size", str(BLOCK_SIZE)]
        return args + (["--read-only"] if read_only else [])

    def attach(self, cl, image, read_only=False, args=None):
        p = self.cli(*(args or self.attach_args(image, read_only)))
        lines = p.stdout.splitlines()
        assert len(lines) == 1 and re.fullmatch(r"/dev/ublkb\d+", lines[0]), \
            f"mloop attach printed {p.stdout!r}, expected one /dev/ublkbN line"
        dev = lines[0]
        assert os.path.exists(dev), f"mloop attach printed {dev}, which does not exist"

        def undo():
            self.cli("detach", dev)
            wait_until(lambda: not os.path.exists(f"/sys/block/{os.path.basename(dev)}"),
                       f"{dev} to go")
        return _attach(cl, dev, undo)

    def leftovers(self, att, image):
        problems = []
        name = os.path.basename(att.device)
        if os.path.exists(f"/sys/block/{name}"):
            problems.append(f"{att.device} still exists")
        char = name.replace("ublkb", "ublkc")
        if os.path.exists(f"/sys/class/ublk-char/{char}"):
            problems.append(f"ublk still has {char} (the device was not deleted)")
        return problems + self.process_and_state_leftovers(image)


class StockClient:
    """Debian's nbd-client against a server this kind starts itself."""

    queues = CONNECTIONS
    block_size = BLOCK_SIZE

    def __init__(self, server):
        self.server = server
        self.name = f"nbd-client-{server}"

    def unavailable(self):
        if shutil.which("nbd-client") is None:
            return "nbd-client is not installed"
        if self.server == "native" and not os.path.exists(SERVER_BIN):
            return "MLOOP_SERVER_BIN does not name the built mloop-server"
        if self.server == "nbdkit":
            if shutil.which("nbdkit") is None:
                return "nbdkit is not installed"
            if not os.path.exists(PLUGIN):
                return "MLOOP_PLUGIN does not name the built plugin"
        return None

    def server_cmd(self, sock, ready, image, read_only):
        """The server's command line: listening on SOCK, writing its pid
        to READY once it listens.  bench/kernel-path overrides it to run
        nbdkit's own file plugin."""
        if self.server == "native":
            return [SERVER_BIN, "--listen", f"unix:{sock}", "--pid-file", ready,
                    "--threads", "4"] + (["--read-only"] if read_only else []) + [image]
        return ["nbdkit", "-f", "-U", sock, "-P", ready] + \
            (["-r"] if read_only else []) + [PLUGIN, f"file={image}", "threads=4"]

    def _start_server(self, cl, image, read_only):
        d = tmpdir(cl)
        sock, ready = os.path.join(d, "nbd.sock"), os.path.join(d, "server.pid")
        cmd = self.server_cmd(sock, ready, image, read_only)
        log = open(os.path.join(d, "server.log"), "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

        def stop():
            log.close()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    raise AssertionError(f"{cmd[0]} ignored SIGTERM")
            if cmd[0] == "nbdkit" and os.path.exists(sock):
                os.unlink(sock)  # nbdkit may leave its -U socket behind
        cl.push(stop)
        # Both servers write the pid file once they listen.
        wait_until(lambda: os.path.exists(ready) or proc.poll() is not None,
                   f"{cmd[0]} to listen")
        assert proc.poll() is None, f"{cmd[0]} exited at startup: " \
            + open(log.name).read().strip()
        return proc, sock, stop

    def attach(self, cl, image, read_only=False):
        proc, sock, stop = self._start_server(cl, image, read_only)
        dev = free_nbd()
        # Read-only comes from the server's export flags alone: the test is
        # that the kernel honours them.
        run(["nbd-client", "-unix", sock, dev, "-C", str(CONNECTIONS),
             "-b", str(BLOCK_SIZE), "-N", "", "-t", str(DEVICE_TIMEOUT)])
        wait_until(lambda: nbd_in_use(dev), f"{dev} to connect")
        self.sock, self.proc = sock, proc

        def undo():
            run(["nbd-client", "-d", dev])
            _wait_nbd_idle(dev)
            stop()
        return _attach(cl, dev, undo, self.queues)

    def leftovers(self, att, image):
        problems = _nbd_leftovers(att.device)
        for pid, cmdline in processes_mentioning(image) + processes_mentioning(att.device):
            problems.append(f"process {pid} left: {cmdline}")
        if os.path.exists(self.sock):
            problems.append(f"socket {self.sock} left behind")
        return problems


class Loop:
    """losetup with direct I/O and 4096-byte sectors, like the nbd kinds.
    A subclass with direct_io False is losetup's default, buffered mode
    (bench/kernel-path compares both)."""

    queues = 1  # the loop driver has a single hardware queue
    block_size = BLOCK_SIZE
    name = "loop"
    direct_io = True

    def unavailable(self):
        if shutil.which("losetup") is None:
            return "losetup is not installed"
        return None

    def attach(self, cl, image, read_only=False):
        p = run(["losetup", "--find", "--show"]
                + (["--direct-io=on"] if self.direct_io else [])
                + ["--sector-size", str(BLOCK_SIZE)] + (["--read-only"] if read_only else [])
                + [image])
        dev = p.stdout.strip()
        want = "1" if self.direct_io else "0"
        assert sysfs(dev, "loop/dio") == want, f"{dev}: loop/dio is not {want}"

        def undo():
            run(["losetup", "--detach", dev])
            wait_until(lambda: sysfs(dev, "loop/backing_file") is None,
                       f"{dev} to detach")
        return _attach(cl, dev, undo)

    def leftovers(self, att, image):
        problems = []
        if sysfs(att.device, "loop/backing_file") is not None:
            problems.append(f"{att.device} still has a backing file")
        if run(["losetup", "--associated", image]).stdout.strip():
            problems.append(f"a loop device still holds {image}")
        return problems


KINDS = {k.name: k for k in [MloopCli("native"), MloopCli("nbdkit"), MloopService(),
                             MloopServiceInProcess(),
                             MloopUblk(),
                             StockClient("native"), StockClient("nbdkit"), Loop()]}
