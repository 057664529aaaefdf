"""Asking mloopd over its control socket, as mloop does: what the tests
of the resident service share (tests/client/test-mloopd*.py,
tests/kernel/test-service-attach.py).  Standard library only."""
import fcntl
import os
import signal
import socket
import time


def private_runtime(directory):
    """A runtime directory of its own for an mloopd under test, made in
    DIRECTORY: (its path, its control socket's path)."""
    run = os.path.join(directory, "run")
    os.mkdir(run, 0o700)
    return run, os.path.join(run, "mloopd.sock")


def stand_in_server(path, server, before):
    """Makes PATH an executable standing in for the server SERVER: it runs
    the shell lines BEFORE (a note of its start, a wait a test holds it
    in), then execs SERVER with its arguments.  Returns PATH."""
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\n{before}exec {server} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


class HeldStart:
    """A stand-in for the server SERVER, made in DIRECTORY, that records
    the pid of each of its starts and, once the test has laid its token
    (lay), takes it and waits until let go (release) before it becomes
    the server: a start held between its spawn and its listening (the
    restart after a kill, say)."""

    def __init__(self, directory, server):
        self.spawned = os.path.join(directory, "spawned")
        self.token = os.path.join(directory, "slow")
        self.held = os.path.join(directory, "slow.taken")
        self.path = stand_in_server(os.path.join(directory, "server"), server, f"""\
echo $$ >> {self.spawned}
if mv {self.token} {self.held} 2>/dev/null; then
  while [ -e {self.held} ]; do sleep 0.05; done
fi
""")

    def lay(self):
        """The next start is held."""
        open(self.token, "w").close()

    def holding(self):
        """Whether a start is held now."""
        return os.path.exists(self.held)

    def release(self):
        """Lets a start held go on (and none be held any more)."""
        for path in (self.token, self.held):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def pids(self):
        """The pid of every start so far, in order."""
        try:
            with open(self.spawned) as f:
                return [int(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []


def ask(control, **fields):
    """One request on the socket CONTROL (keys with _ sent with -); the
    answer's fields."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(60)
        s.connect(control)
        s.send(b"".join(f"{k.replace('_', '-')}={v}".encode() + b"\0"
                        for k, v in fields.items()))
        data = s.recv(70000)
    return dict(f.decode().split("=", 1) for f in data.split(b"\0") if f)


def attaching(directory):
    """Makes DIRECTORY, a device's directory, and holds its lock, as
    `mloop attach` does from its claim until it has written the device's
    state (device_state.h): an attach under way, until the descriptor
    returned is closed.  mloopd drops a device whose directory has no
    state and whose lock nobody holds: an attach that died."""
    os.mkdir(directory, 0o700)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def kept(control):
    """The device directories mloopd keeps."""
    dirs = ask(control, op="list").get("dirs", "")
    return set(dirs.split("\n")) if dirs else set()


def server_pid(directory):
    """The pid in a device directory's server.pid, 0 without one."""
    try:
        with open(os.path.join(directory, "server.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def wait_for(what, cond, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def descriptors(pid):
    """How many descriptors process PID holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def descriptor_kinds(pid):
    """What process PID's descriptors are, counted: {target: n}."""
    kinds = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
        target = target.split(":[")[0] if ":[" in target else os.path.basename(target)
        kinds[target] = kinds.get(target, 0) + 1
    return kinds


def descriptor_limit(pid):
    """Process PID's (soft, hard) RLIMIT_NOFILE."""
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError(f"no open files limit for {pid}")


def kill(pids):
    """SIGKILL to each of PIDS still there: the servers a test's mloopd
    started, which outlive it by design."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start(command, env, log_path, control, timeout=30):
    """Runs mloopd (COMMAND, a list) with its output appended to
    LOG_PATH and returns its Popen once it answers on CONTROL; the
    caller stops it (harness.kill_at_exit).  AssertionError if it ends or
    does not answer within TIMEOUT s."""
    import subprocess
    log = open(log_path, "a")
    p = subprocess.Popen(command, env=env, stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        try:
            ask(control, op="list")
            return p
        except OSError:
            time.sleep(0.02)
    if p.poll() is None:
        p.kill()
        p.wait()
    raise AssertionError(f"mloopd did not answer on {control}")


def processes_naming(mark):
    """The pids of the live processes whose command line contains MARK
    (bytes or str): a device's servers, by its socket path."""
    mark = os.fsencode(mark)
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in cmdline and state not in "ZX":
            pids.append(int(pid))
    return pids


def alive(pid):
    """Whether PID is a live process (not gone, not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
