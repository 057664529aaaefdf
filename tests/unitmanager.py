"""A real systemd service manager for tests of mloop's units, on a
machine (or VM) whose PID 1 is not systemd.

systemd's user manager, run by root, applies a unit's whole sandbox
(mount namespace, capability bounding set, seccomp filter, address
families) exactly as the system manager does; what differs is only the
unit search path and the bus it watches.  It refuses to start unless
the machine "was booted with systemd" (/run/systemd/system exists), so
it runs in a private mount namespace where a tmpfs on /run/systemd says
so, with the "inaccessible" nodes its namespaces bind over hidden paths
(the user manager looks for them there too), and cgroup2 mounted when
the machine has no cgroup hierarchy (the test VM).  Nothing of this is
seen outside the namespace.

The units under test are the build tree's configured ones; a drop-in
per test names its image, address and the build tree's programs.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

SYSTEMD = "/lib/systemd/systemd"

# Runs in the new mount namespace, then becomes the manager.
NAMESPACE_SETUP = r"""
set -e
mkdir -p /run/systemd
mount -t tmpfs -o mode=755 mloop-test-systemd /run/systemd
mkdir /run/systemd/system /run/systemd/inaccessible
cd /run/systemd/inaccessible
mkdir -m 0 dir
: > reg && chmod 0 reg
mkfifo -m 0 fifo
mknod -m 0 chr c 0 0
mknod -m 0 blk b 0 0
python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'
chmod 0 sock
cd /
if ! grep -q ' cgroup2\? ' /proc/self/mountinfo; then
    mount -t cgroup2 none /sys/fs/cgroup
fi
exec "$@"
"""


class Unavailable(Exception):
    """What the machine lacks to run the manager (a SKIP)."""


class UserManager:
    def __init__(self, parent="/run", env=None):
        """ENV: the manager's environment, which its services get too
        (this process's by default).  The manager joins the bus its
        dbus.socket and dbus.service run (write_unit() them before
        starting it), as org.freedesktop.systemd1."""
        if os.geteuid() != 0:
            raise Unavailable("a root service manager needs root")
        for tool in ("systemctl", "unshare", "python3", "mknod"):
            if shutil.which(tool) is None:
                raise Unavailable(f"{tool} is not installed")
        if not os.access(SYSTEMD, os.X_OK):
            raise Unavailable(f"{SYSTEMD} is not installed (Debian: systemd)")
        # Not under /tmp or /var/tmp: the units under test have their own
        # (PrivateTmp=), and may need to reach what is in here (a bus).
        self.dir = tempfile.mkdtemp(prefix="mloop-units-", dir=parent)
        self.runtime = os.path.join(self.dir, "runtime")
        self.units = os.path.join(self.dir, "config", "systemd", "user")
        os.makedirs(self.runtime, mode=0o700)
        os.makedirs(self.units)
        self.env = dict(env or os.environ, XDG_RUNTIME_DIR=self.runtime,
                        XDG_CONFIG_HOME=os.path.join(self.dir, "config"))
        self.env.pop("DBUS_SESSION_BUS_ADDRESS", None)
        # The test VM runs the tests chrooted, where systemctl would
        # otherwise ignore its commands.
        self.env["SYSTEMD_IGNORE_CHROOT"] = "1"
        # Not the machine's session bus: a test's bus, if any.
        os.symlink("/dev/null", os.path.join(self.units, "dbus.socket"))
        self.proc = None

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        self.log_path = os.path.join(self.dir, "manager.log")
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private",
             "sh", "-c", NAMESPACE_SETUP, "sh",
             SYSTEMD, "--user", "--unit=basic.target", "--log-target=console"],
            env=self.env, stdin=subprocess.DEVNULL,
            stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT)
        end = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise Unavailable("systemd's manager did not start: " + self.manager_log())
            # Not is-system-running: that says "offline" outside the
            # namespace, where /run/systemd/system does not exist.
            r = self.systemctl("show", "--property=SystemState", "--value", check=False)
            if r.stdout.strip() in ("running", "degraded"):
                return
            if time.monotonic() > end:
                raise AssertionError("systemd's manager is not running: "
                                     f"{r.stdout.strip()} {r.stderr.strip()} "
                                     f"{self.manager_log()}")
            time.sleep(0.1)

    def manager_log(self):
        try:
            with open(self.log_path) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def systemctl(self, *args, check=True):
        r = subprocess.run(["systemctl", "--user", *args], env=self.env,
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"systemctl {' '.join(args)}: {r.stderr.strip()}")
        return r

    def install(self, unit_file, name=None):
        """Copies UNIT_FILE where the manager looks (as NAME)."""
        shutil.copy(unit_file, os.path.join(self.units, name or os.path.basename(unit_file)))

    def write_unit(self, name, text):
        """A unit file (or NAME.d/FILE drop-in) of TEXT where the manager
        looks; before the manager starts, or then daemon-reload."""
        path = os.path.join(self.units, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write(text)

    def drop_in(self, unit, text):
        self.write_unit(unit + ".d/test.conf", text)
        self.systemctl("daemon-reload")

    def main_pid(self, unit):
        r = self.systemctl("show", "--property=MainPID", "--value", unit)
        pid = int(r.stdout.strip() or 0)
        return pid or None

    def state(self, unit):
        return self.systemctl("is-active", unit, check=False).stdout.strip()

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            # Stops every unit (their KillMode= applies), then exits.
            self.systemctl("exit", check=False)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def process_status(pid):
    """/proc/PID/status as a dict: what the kernel says of its sandbox."""
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def capability_mask(names):
    """The CapBnd mask of capability NAMES (CAP_SYS_ADMIN...)."""
    numbers = {"CAP_CHOWN": 0, "CAP_DAC_OVERRIDE": 1, "CAP_FOWNER": 3,
               "CAP_IPC_LOCK": 14, "CAP_SYS_MODULE": 16, "CAP_SYS_ADMIN": 21,
               "CAP_SYS_RESOURCE": 24, "CAP_SETGID": 6, "CAP_SETUID": 7}
    mask = 0
    for n in names:
        mask |= 1 << numbers[n]
    return mask


def unit_value(unit_file, key):
    """KEY='s value in UNIT_FILE's [Service] (the last, if repeated)."""
    value = None
    section = None
    with open(unit_file) as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                section = line
            elif section == "[Service]" and line.startswith(key + "="):
                value = line[len(key) + 1:]
    return value
