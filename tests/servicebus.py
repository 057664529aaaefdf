"""A private system bus for mloop's D-Bus service: a real dbus-daemon
(its own socket, activating mloop-dbus from the build tree as the system
bus would) and a real polkitd, which sees the tests' polkit rules and
mloop's actions through bind mounts in a mount namespace of its own, so
nothing of the machine's is changed.

With a unit (mloop-dbus.service), the bus runs as systemd runs the
system bus, under a real systemd manager (tests/unitmanager.py), which
starts the service in that unit, sandbox and all, when the bus
activates it.

Two existing users play the callers: USER, whom the rules let do what
mloop's actions allow, and OTHER, whom they do not.  Used by the host's
tests/client/test-dbus-service.py and the VM's test-dbus-attach.py and
test-dbus-unit.py.
"""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import procstop
import unitmanager

POLKITD = "/usr/lib/polkit-1/polkitd"
SERVICE_NAME = "org.mloop.Manager1"
# (name, uid, gid): Debian's nobody and daemon.
USER = ("nobody", 65534, 65534)
OTHER = ("daemon", 1, 1)

ALLOW_USER = """
polkit.addRule(function(action, subject) {
    if (action.id.indexOf("org.mloop.") == 0 && subject.user == "%s")
        return polkit.Result.YES;
});
""" % USER[0]
# OTHER may attach too, but not detach another's device.
ALLOW_BOTH_ATTACH = ALLOW_USER + """
polkit.addRule(function(action, subject) {
    if ((action.id == "org.mloop.attach" || action.id == "org.mloop.detach")
        && subject.user == "%s")
        return polkit.Result.YES;
});
""" % OTHER[0]
DENY_ATTACH = """
polkit.addRule(function(action, subject) {
    if (action.id == "org.mloop.attach")
        return polkit.Result.NO;
});
"""

BUS_CONF = """<!DOCTYPE busconfig PUBLIC
 "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={dir}/bus</listen>
  <auth>EXTERNAL</auth>
  <servicedir>{dir}/services</servicedir>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus"
           send_interface="org.freedesktop.DBus"/>
  </policy>
  <includedir>/usr/share/dbus-1/system.d</includedir>
  <include>{policy}</include>
</busconfig>
"""


class Unavailable(Exception):
    """What the machine lacks for the bus (the test skips)."""


def _wait(pred, what, timeout=20):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ServiceBus:
    def __init__(self, service_bin, source_dbus_dir, env=None, unit=None, subuid=None,
                 passwd=None, group=None):
        """ENV: the environment of the bus and what it starts (the
        service's runtime directory, say); this process's by default.
        UNIT: the built mloop-dbus.service; the bus then activates the
        service through systemd (tests/unitmanager.py), which runs it in
        that unit, sandbox and all, as on a machine booted with systemd.
        SUBUID: the text of /etc/subuid the service sees (bound over the
        machine's in a mount namespace of its own, which later mounts of
        the machine's may not reach), or None for the machine's.  PASSWD,
        GROUP: likewise, the text of /etc/passwd and /etc/group the
        service sees."""
        for tool in ("dbus-daemon", "gdbus", "unshare", "setpriv"):
            if shutil.which(tool) is None:
                raise Unavailable(f"{tool} is not installed")
        if not os.path.exists(POLKITD):
            raise Unavailable(f"{POLKITD} is not installed (Debian: polkitd)")
        if not os.path.exists(service_bin):
            raise Unavailable(f"{service_bin} is not built (-Ddbus)")
        self.service_bin = service_bin
        self.src = source_dbus_dir
        # Under /run, as the system bus is: the unit's service has a
        # /tmp of its own.
        self.dir = tempfile.mkdtemp(prefix="mloop-bus-", dir="/run" if unit else None)
        # Users reach the socket in here.
        os.chmod(self.dir, 0o755)
        self.address = f"unix:path={self.dir}/bus"
        self.env = dict(env or os.environ, DBUS_SYSTEM_BUS_ADDRESS=self.address)
        self.daemon = self.polkitd = self.manager = None
        self.service_args = []
        self.service_env = {}
        self.service_wrapper = []
        self.unit = unit
        self._set_etc(subuid, passwd, group)
        if unit is not None and not os.path.exists(unit):
            raise Unavailable(f"{unit} is not built (no systemd pkg-config file at setup)")

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _write(self, name, text):
        path = os.path.join(self.dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def _start(self):
        policy = os.path.join(self.src, "org.mloop.Manager1.conf")
        self._write("bus.conf", BUS_CONF.format(dir=self.dir, policy=policy))
        self._write_service_file()
        actions = os.path.join(self.dir, "actions")
        shutil.copytree("/usr/share/polkit-1/actions", actions)
        shutil.copy(os.path.join(self.src, "org.mloop.policy"), actions)
        os.makedirs(os.path.join(self.dir, "rules"))
        if self.unit:
            self._start_under_systemd()
        else:
            self.daemon = subprocess.Popen(
                ["dbus-daemon", "--nofork", f"--config-file={self.dir}/bus.conf"],
                env=self.env, stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(self.dir, "daemon.log"), "w"))
            _wait(lambda: os.path.exists(f"{self.dir}/bus") or self.daemon.poll() is not None,
                  "dbus-daemon's socket")
            if self.daemon.poll() is not None:
                raise AssertionError("dbus-daemon exited: " + self.log("daemon.log"))
        self.set_rules(ALLOW_USER)
        if self.unit:
            _wait(lambda: self.name_owner_pid("org.freedesktop.systemd1"), "systemd on the bus")

    def _start_under_systemd(self):
        """The bus as systemd runs the system bus: dbus.socket and
        dbus.service of the manager (whose bus it then joins, as
        org.freedesktop.systemd1), the daemon asking systemd to start
        the services it activates.  The unit under test runs the build
        tree's service, its output in the bus's directory."""
        self.manager = unitmanager.UserManager(env=self.env)
        # The manager's bus is where it looks for it.
        bus = os.path.join(self.manager.runtime, "bus")
        self.address = f"unix:path={bus}"
        self.env["DBUS_SYSTEM_BUS_ADDRESS"] = self.manager.env["DBUS_SYSTEM_BUS_ADDRESS"] = \
            self.address
        for d in (self.manager.dir, self.manager.runtime):
            os.chmod(d, 0o755)                      # users and polkitd reach the bus
        self.manager.write_unit("dbus.socket", f"[Socket]\nListenStream={bus}\n")
        self.manager.write_unit(
            "dbus.service",
            f"[Service]\nExecStart=dbus-daemon --config-file={self.dir}/bus.conf "
            "--address=systemd: --nofork --nopidfile --systemd-activation\n"
            f"StandardError=append:{self.dir}/daemon.log\n")
        self.manager.install(self.unit)
        self._write_service_file()
        self.manager.__enter__()
        self.manager.systemctl("start", "dbus.socket")

    def _write_service_file(self):
        # Variables of the service's own (its runtime directory, say),
        # set by env(1): the bus gives what it starts its own environment.
        env = ["/usr/bin/env"] + [f"{k}={v}" for k, v in self.service_env.items()] \
            if self.service_env else []
        command = " ".join(env + self.service_wrapper + [self.service_bin] +
                           self.service_args)
        exec_line = command
        # Files of /etc the service sees in place of the machine's.
        binds = {self._write(name, text): f"/etc/{name}"
                 for name, text in self.etc.items()}
        if binds and not self.unit:
            # The bus runs a program by its absolute path only;
            # slave: the tests' later mounts (FUSE) reach the service.
            mounts = "".join(f"mount --bind {source} {target} && "
                             for source, target in binds.items())
            exec_line = (f"{shutil.which('unshare')} --mount --propagation slave "
                         f"{shutil.which('sh')} -c '{mounts}exec {command}'")
        activation = ("[D-BUS Service]\nName=org.mloop.Manager1\n"
                      f"Exec={exec_line}\nUser=root\n")
        if self.unit:
            activation += f"SystemdService={os.path.basename(self.unit)}\n"
        self._write("services/org.mloop.Manager1.service", activation)
        if self.manager is not None:
            # The unit runs the build tree's service, with these options.
            self.manager.write_unit(os.path.basename(self.unit) + ".d/test.conf",
                                    f"[Service]\nExecStart=\nExecStart={command}\n"
                                    f"StandardOutput=append:{self.dir}/service.log\n"
                                    f"StandardError=append:{self.dir}/service.log\n" +
                                    "".join(f"BindReadOnlyPaths={source}:{target}\n"
                                            for source, target in binds.items()))
            if self.manager.proc is not None:
                self.manager.systemctl("daemon-reload")

    def _set_etc(self, subuid, passwd, group):
        self.etc = {name: text for name, text in (("subuid", subuid), ("passwd", passwd),
                                                  ("group", group))
                    if text is not None}

    def set_service_args(self, args, subuid=None, passwd=None, group=None, env=None,
                         wrapper=None):
        """The service's options (mloop-dbus(8)) from its next start on,
        and the /etc/subuid, /etc/passwd and /etc/group it sees (SUBUID,
        PASSWD, GROUP: as for __init__), ENV, variables of its own (a
        dict), and WRAPPER, a command (absolute paths) that runs it (a
        list: the service's command line follows it): the running one
        is stopped, and the bus rereads its service files."""
        self.kill_service()
        self.service_args = list(args)
        self.service_env = dict(env or {})
        self.service_wrapper = list(wrapper or [])
        self._set_etc(subuid, passwd, group)
        self._write_service_file()
        subprocess.run(
            ["gdbus", "call", "--system", "--dest", "org.freedesktop.DBus",
             "--object-path", "/org/freedesktop/DBus", "--method",
             "org.freedesktop.DBus.ReloadConfig"],
            env=self.env, check=True, capture_output=True)

    def log(self, name):
        try:
            with open(os.path.join(self.dir, name)) as f:
                return f.read()
        except OSError:
            return ""

    def name_owner_pid(self, name):
        """The pid owning NAME on the bus, or None."""
        r = subprocess.run(
            ["gdbus", "call", "--system", "--dest", "org.freedesktop.DBus",
             "--object-path", "/org/freedesktop/DBus", "--method",
             "org.freedesktop.DBus.GetConnectionUnixProcessID", name],
            env=self.env, capture_output=True, text=True)
        if r.returncode != 0:
            return None
        return int(r.stdout.strip().strip("(),").split()[-1])

    def set_rules(self, rules):
        """Restarts polkitd with RULES as the only local rules: one that
        reads its rules afresh, not whenever it notices the change."""
        self._stop_polkitd()
        self._write("rules/50-mloop-test.rules", rules)
        binds = (f"mount --bind {self.dir}/actions /usr/share/polkit-1/actions && "
                 f"mount --bind {self.dir}/rules /etc/polkit-1/rules.d && "
                 f"exec {POLKITD} --no-debug")
        self.polkitd = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", binds],
            env=self.env, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "polkitd.log"), "a"))
        _wait(lambda: self.name_owner_pid("org.freedesktop.PolicyKit1") or
              self.polkitd.poll() is not None, "polkitd on the bus")
        if self.polkitd.poll() is not None:
            raise AssertionError("polkitd exited: " + self.log("polkitd.log"))

    def _stop_polkitd(self):
        if self.polkitd and self.polkitd.poll() is None:
            self.polkitd.terminate()
            try:
                self.polkitd.wait(10)
            except subprocess.TimeoutExpired:
                self.polkitd.kill()
                self.polkitd.wait()
        self.polkitd = None
        if self._bus_running():
            _wait(lambda: not self.name_owner_pid("org.freedesktop.PolicyKit1"),
                  "polkitd to leave the bus")

    def service_pid(self):
        return self.name_owner_pid(SERVICE_NAME)

    def kill_service(self, sig=signal.SIGTERM):
        pid = self.service_pid()
        if pid:
            os.kill(pid, sig)
            _wait(lambda: procstop.has_exited(pid), "mloop-dbus to exit")
            _wait(lambda: not self.service_pid(), "mloop-dbus to leave the bus")

    def run_as(self, user, argv, **kw):
        """ARGV run as USER (a (name, uid, gid)) on this bus."""
        _, uid, gid = user
        return subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
            + list(argv), env=self.env, capture_output=True,
            text=kw.pop("text", True), timeout=kw.pop("timeout", 120), **kw)

    def _bus_running(self):
        if self.manager is not None:
            return self.manager.proc is not None and self.manager.proc.poll() is None
        return self.daemon is not None and self.daemon.poll() is None

    def close(self):
        try:
            if self._bus_running():
                self.kill_service()
        finally:
            self._stop_polkitd_quietly()
            if self.manager is not None:
                self.manager.close()    # the bus and the service's unit with it
            if self.daemon and self.daemon.poll() is None:
                self.daemon.terminate()
                self.daemon.wait()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _stop_polkitd_quietly(self):
        if self.polkitd and self.polkitd.poll() is None:
            self.polkitd.kill()
            self.polkitd.wait()


def run_on_bus(service_bin, source_dbus_dir, prefix, run, skip):
    """RUN(bus, work) with a ServiceBus of SERVICE_BIN (source_dbus_dir
    as for ServiceBus) and WORK a directory of its own (PREFIX, users may
    look in), removed after; SKIP(reason) when the machine lacks what the
    bus needs."""
    try:
        bus = ServiceBus(service_bin, source_dbus_dir)
    except Unavailable as e:
        skip(str(e))
        return
    work = tempfile.mkdtemp(prefix=prefix)
    os.chmod(work, 0o755)
    try:
        with bus:
            run(bus, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def stop_gdb(debugger):
    """Waits for gdb (holding the service at a breakpoint) to detach and
    end; one still waiting for its breakpoint is interrupted (its script
    then ends, and gdb detaches, taking its breakpoint out of the
    service).  What gdb printed."""
    for stop in (None, signal.SIGINT, signal.SIGKILL):
        if stop is not None and debugger.poll() is None:
            debugger.send_signal(stop)
        try:
            return debugger.communicate(timeout=15)[0] or ""
        except subprocess.TimeoutExpired:
            pass
    return ""


def poll_until(pred, timeout=20):
    """Polls PRED every 50 ms until it holds or TIMEOUT seconds pass."""
    end = time.monotonic() + timeout
    while not pred() and time.monotonic() < end:
        time.sleep(0.05)


def gdb_hold_until_go(breakpoint):
    """A gdb script (for str.format with held, go and ready) that holds
    the service's thread at BREAKPOINT (a gdb break spec) until the file
    {go} exists: it touches {ready} once gdb waits, {held} once the
    thread is held, and detaches when let go."""
    return ("set pagination off\n"
            "set confirm off\n"
            "set breakpoint pending on\n"
            "handle all nostop noprint pass\n"
            f"break {breakpoint}\n"
            "commands 1\n"
            "silent\n"
            "shell touch {held}\n"
            "shell while [ ! -e {go} ]; do sleep 0.05; done\n"
            "delete 1\n"
            "detach\n"
            "quit\n"
            "end\n"
            "shell touch {ready}\n"
            "continue\n")


def start_gdb_hold(bus, gdb, work, breakpoint):
    """Starts GDB holding BUS's service at BREAKPOINT until WORK/go
    exists (gdb_hold_until_go): the gdb process and the paths of the
    held, go and ready files, any left from an earlier hold removed."""
    held, go, ready = (os.path.join(work, f) for f in ("held", "go", "ready"))
    for f in (held, go, ready):
        if os.path.exists(f):
            os.unlink(f)
    script = os.path.join(work, "hold.gdb")
    with open(script, "w") as f:
        f.write(gdb_hold_until_go(breakpoint).format(held=held, go=go, ready=ready))
    debugger = subprocess.Popen([gdb, "-q", "-batch", "-nx", "-x", script, "-p",
                                 str(bus.service_pid())],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return debugger, held, go, ready
