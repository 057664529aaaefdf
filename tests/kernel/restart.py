"""Helpers for the supervision tests (mloop attach kinds only): kill a
device's server and wait for its supervisor to bring the device back."""
import errno
import json
import mmap
import os
import signal
import time

from kfix import sysfs, wait_until
import kinds


def attach(kind, cl, image, timeout, extra=()):
    """Attaches with a short request timeout (also the dead-connection
    timeout): requests in flight on a killed server are requeued when it
    expires, and a device without a server fails after it.  A ublk
    device's request timeout is mloop-ublk's own (it only tells the
    kernel of a dead server): the kernel holds its IO for the next server
    and gives it what the dead one had taken; TIMEOUT is how long it may
    be without one before its IO fails.  EXTRA: more options of attach."""
    args = kind.attach_args(image) + list(extra)
    if isinstance(kind, kinds.MloopUblk):
        return kind.attach(cl, image, args=args + ["--dead-timeout", str(timeout)])
    return kind.attach(cl, image, args=args + ["--timeout", str(timeout)])


def status(kind, dev):
    return json.loads(kind.cli("status", "--json", dev).stdout)


def kill_mark(dev, pid):
    """Tells the kernel log that DEV's server PID is about to be killed on
    purpose: the requests it held can only come back through the device's
    request timeout, so the kernel log check forgives "Connection timed
    out" for that long after this mark, and only then (run-kernel-tests)."""
    timeout_ms = sysfs(dev, "queue/io_timeout") or "0"
    with open("/dev/kmsg", "w") as f:
        f.write(f"<4>mloop-ktest-kill: {dev} server {pid}, "
                f"request timeout {int(timeout_ms) // 1000} s\n")


def sigkill_server(dev, pid):
    """SIGKILLs DEV's server PID, marking it in the kernel log first."""
    kill_mark(dev, pid)
    os.kill(pid, signal.SIGKILL)


def kill_server(kind, dev, timeout=30, killed=None):
    """SIGKILLs DEV's server, waits until the supervisor has a new one
    serving the device, and returns the seconds that took.  Where the
    server is mloopd itself (the in-process kind), mloopd is killed and
    started again, as systemd would: the next one serves the device.
    KILLED, if given, is called right after the kill (with the killed
    pid), before the wait: what lets a server stuck in the kernel die."""
    if isinstance(kind, kinds.MloopServiceInProcess) and \
            status(kind, dev)["device"]["server_in_process"]:
        return kill_service(kind, dev, timeout)
    before = status(kind, dev)
    pid = before["device"]["server_pid"]
    assert before["server_running"], f"{dev}: server pid {pid} not running before the kill"
    sigkill_server(dev, pid)
    start = time.monotonic()
    if killed:
        killed(pid)

    def back():
        s = status(kind, dev)
        return (s["restarts"] > before["restarts"] and s["server_running"]
                and s["device"]["server_pid"] != pid
                and s.get("connections_open") == kind.queues)
    try:
        wait_until(back, f"{dev}'s server to be restarted and reconnected", timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {status(kind, dev)}; supervisor.log: "
                             f"{supervisor_log(before)[-8:]}; server.log: "
                             f"{server_log(before)[-6:]}; {stuck_servers()}") from None
    return time.monotonic() - start


def kill_service(kind, dev, timeout):
    """kill_server for a device served inside mloopd: SIGKILL to mloopd,
    a new one started; the seconds until it serves DEV, whole."""
    pid = status(kind, dev)["device"]["server_pid"]
    kill_mark(dev, pid)
    start = time.monotonic()
    kind.service.kill()
    kind.service.start()

    def back():
        s = status(kind, dev)
        return (s["server_running"] and s["device"]["server_pid"] not in (0, pid)
                and s.get("connections_open") == kind.queues)
    wait_until(back, f"{dev} to be served by the next mloopd", timeout)
    return time.monotonic() - start


def read_fails_eio(fd, what):
    """Reads the first block of FD (O_DIRECT), which must fail with EIO;
    returns the seconds that took.  WHAT describes the device."""
    buf = mmap.mmap(-1, 4096)
    start = time.monotonic()
    try:
        os.preadv(fd, [buf], 0)
    except OSError as e:
        assert e.errno == errno.EIO, f"read failed with {e}, expected EIO"
        return time.monotonic() - start
    raise AssertionError(f"a read from {what} succeeded")


def server_log(st):
    try:
        with open(st["device"]["server_log"], errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        return [str(e)]


def stuck_servers():
    """Where each server process's threads wait in the kernel."""
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            if "mloop-ublk" not in cmd and "mloop-server" not in cmd:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stack") as f:
                    stack = " < ".join(l.split()[1] for l in f.read().splitlines()[:6])
                out.append(f"{pid}/{tid} {cmd[:60]}: {stack}")
        except OSError:
            continue
    return "stacks: " + " | ".join(out)


def supervisor_log(st):
    """The last lines of the supervisor's log, from a status()."""
    path = os.path.join(os.path.dirname(st["device"]["server_log"]), "supervisor.log")
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        return [str(e)]


# fsync(2) and fdatasync(2) on x86_64, the guest's architecture.
SYNC_SYSCALLS = {"74", "75"}


def waits_in_sync(pid):
    """Whether a thread of process PID waits, unkillable (state D), in a
    sync (a server's on a queued write, a supervisor's on its device)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                call = f.read().split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state == "D" and call in SYNC_SYSCALLS:
            return True
    return False


def alive(pid):
    """Whether PID runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def supervisor_of(st):
    """The pid of the supervisor whose directory holds ST's server log."""
    want = f"--dir={os.path.dirname(st['device']['server_log'])}".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"mloop-supervisor") and want in argv:
            return int(pid)
    raise AssertionError(f"no mloop-supervisor with {want.decode()}")
