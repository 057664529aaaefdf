"""Runs the kernel tests for one kind (see kinds.py) and prints one TAP
result line per test, flushed at once; runs as root where the kernel has
nbd and loop (in the test VM, or natively).

  runner.py KIND [GROUP | TEST...]   (GROUP: main, the default, durable or many)

The plan line ("1..N") is left to run-kernel-tests, which also adds results
for what it sees from outside (a VM that died, the kernel log).  Before each
test a marker goes to the kernel log (/dev/kmsg), so kernel messages can be
attributed to the test that caused them.
"""
import importlib.util
import os
import shutil
import sys
import threading
import time
import traceback

import kfix
import kinds
import recvwork

HERE = os.path.dirname(os.path.abspath(__file__))
# Every kind runs these: the device's geometry, a filesystem, verified IO,
# concurrent readers, read-only and a clean detach.
COMMON = ["attach-geometry", "ext4-roundtrip", "fio-verify", "dd-readers",
          "read-only", "detach-clean"]
# The mloop command line's own contract, for the CLI kinds.
CLI_ONLY = ["cli-block-size", "cli-list-status", "cli-detach-forms", "cli-errors",
            "attach-busy", "attach-skips-held", "offset-window", "partitions",
            "queue-settings", "autoclear", "resize", "many-devices", "overlay",
            "dbus-attach", "dbus-unit", "dbus-pinned", "dbus-stale-detach",
            "service-attach"]
# A device that survives its server (mloop-supervisor), for the CLI kinds.
SUPERVISED = ["restart-fio", "restart-fsync", "restart-dying", "restart-hostile-client",
              "io-flusher"]
# Durability through the kernel, on device-mapper targets under the image
# (dmtarget.py): a power cut replayed at every flush, a failing disk, one
# that drops writes, a slow one, one that stalls past the request timeout
# (CLI kinds only: the supervisor reconnects), a full filesystem, a power
# cut under a copy-on-write overlay (CLI kinds only).  For the CLI kinds
# and for loop, the reference; the stock client adds nothing here.
DURABLE = ["power-cut", "power-cut-early-ack", "failing-disk", "dropped-writes",
           "slow-disk", "stall-reconnect", "out-of-space", "power-cut-overlay",
           "power-cut-overlay-early-ack", "power-cut-overlay-fua", "overlay-sync-error",
           "overlay-dsync-nospace"]
# mloopd under stress, for the service kind: 16 devices under fio while
# mloopd is killed twice and a server once, and a device whose disk
# stalls or fails beside one whose latency is measured.
SERVICE = ["service-kill-many", "service-neighbour"]
# Serving to other machines, through this machine's loopback; a remote
# device that survives its server's restarts (its supervisor reconnects).
REMOTE = ["remote-attach", "remote-restart"]
# An RBD image as the device, from a Ceph cluster inside the guest.
RBD = ["rbd"]
# The Debian packages installed in a writable root over the guest's and
# used there (attach, fstab, the attach unit), then purged: for the
# native kind only, since the test runs the installed programs whatever
# the group's kind.
PACKAGE = ["package"]


# The durability tests take a VM of their own (they alone take as long as
# the rest together): run-kernel-tests KIND SERIES durable.  "many" is
# test-many-devices alone, for the full tier's 256 devices
# (MLOOP_MANY_DEVICES), which take a VM of their own too.
GROUPS = ["main", "durable", "many"]


# What `mloop attach --transport ublk` runs beyond COMMON: mloop-ublk on
# its own (ublk-smoke: its contract, discard and zero, refusals, user
# recovery), the command line's contract where it is the same for both
# transports, and a device that survives its server (ublk's user
# recovery, through the supervisor).
UBLK = ["ublk-smoke", "ublk-cli", "restart-fio", "restart-full-queue", "restart-fsync",
        "restart-dying", "restart-hung-image", "ublk-stop-server-dies", "ublk-foreign-stop",
        "ublk-detach-recovering", "ublk-detach-slow-stop", "ublk-stop-slow-sync",
        "ublk-detach-orphan-attempt", "overlay"]


# The standard tier (MLOOP_TEST_TIER unset or "standard"; docs/testing.md)
# runs the command line's own contract once: with the native server on
# the default kernel (6.1), where every test of the group runs.  Elsewhere
# it keeps what changes with the server or the kernel: what every kind
# runs, the supervisor's restarts (each server dies and is restarted its
# own way; on 6.12 the driver's dead-connection handling differs) and,
# for nbdkit, what nbdkit serves differently (resize restarts it; the
# window is the server's).  A remote device's reconnects, and a stalled
# disk's, are the supervisor's and the kernel's, whichever server serves:
# the native server's run in the standard tier (under nbdkit 1.32.5 the
# stall also shows nbdkit's known abort, which restart-hostile-client
# covers).  The overlay is the engine's, whichever server: its power cut
# runs with the native server, and the proof that it can fail (81 s) in
# the full tier only, as does a failed writeback for want of space met
# by a FUA write and by restarted servers (overlay-dsync-nospace, 55-80
# s: the standard tier has no room left; overlay-sync-error keeps a
# failed sync's latch there, and the unit suite its mark).  An RBD image through the kernel (a Ceph cluster
# booted in the guest, about 4.5 minutes in all) runs in the full tier
# only, over NBD on 6.1 and over ublk on 6.12: the standard tier keeps
# the store against a real cluster on the host (the ceph suite: its
# peers, lock record, a device's successive servers, the protocol suites
# on RBD images), and the kernel's side of it is the NBD device every
# other test here drives.
# The installed packages run on 6.1 (what the package is for is the same
# on either kernel).  The full tier runs every test of the group.
# mloop-dbus under its systemd unit (dbus-unit) repeats dbus-attach with
# the sandbox on, 20-64 s: the full tier runs it; the standard tier's
# host test-unit-sandbox.py still checks the unit's keys and exposure.
# dbus-attach itself (50-58 s) too: the standard tier attaches through
# the service in the VM with dbus-pinned and dbus-stale-detach (9 and
# about 75 s), and the host's test-dbus-service.py runs the calls, refusals
# and limits against a real dbus-daemon and polkitd.
# A remote device's restarts (remote-restart, about 50 s) run through
# mloopd's keeper on 6.12 (service) in the standard tier; the native
# kind's per-process supervisor runs the same keeper, so its run on 6.1
# is the full tier's (remote-attach stays).
# The installed packages in the VM (package, 40-60 s) and nbdkit's slow
# disk (slow-disk on 6.12, about 44 s) are the full tier's too: every
# CI run builds, lints, installs, uses and purges the packages on the
# host (scripts/check-package), and the native server's slow disk runs
# on 6.1 in the standard tier (the engine's AIO under both servers).
# (kind name, kernel series) -> what the standard tier leaves out.
_NBDKIT_LEAVES_OUT = [t for t in CLI_ONLY if t not in ("resize", "offset-window")] + \
    ["remote-restart", "slow-disk", "stall-reconnect", "power-cut-overlay", "power-cut-overlay-fua",
     "overlay-sync-error", "overlay-dsync-nospace", "rbd"]
# The service kind (every server kept by one mloopd) takes 6.12's
# standard place from the native kind, whose per-process supervisor
# runs the same keeper: what every kind runs, the restarts and the remote
# device, and of the command line's contract what goes another way
# through mloopd (a server's failure to start, autoclear, a resize's
# restart).  The rest of the group, and 6.1's, in the full tier, and so
# are mloopd's stress tests (SERVICE: 16 devices under kills, 70-90 s;
# a neighbour's stalled and failing disk, about 52 s): service-attach
# kills mloopd and a server under fio in the standard tier.  Of the
# restarts, restart-fio and restart-hostile-client (18 and 13 s) run in
# the standard tier for the native and nbdkit kinds on 6.1 and for ublk:
# the keeper is the same code in mloopd, whose restart-fsync,
# restart-dying and service-attach stay.
_SERVICE_KEEPS = ("cli-errors", "autoclear", "resize")
_SERVICE_RESTARTS_ELSEWHERE = ["restart-fio", "restart-hostile-client"]
# ublk's overlay (70 s): the overlay's engine layer runs in the standard
# tier behind nbd in kernel 6.1 (native); ublk's restarts, with --recover,
# in its restart tests.  The full tier runs it, and a detach whose
# supervisor's stop outlasts detach's 30 s patience (ublk-detach-slow-stop,
# about 45 s: the standard tier's ublk-detach-recovering keeps the stop's
# recovery).
STANDARD_LEAVES_OUT = {
    ("native", "6.1"): ["power-cut-overlay-early-ack", "overlay-dsync-nospace", "dbus-unit",
                        "dbus-attach", "rbd", "remote-restart"] + PACKAGE,
    ("service", "6.1"): SERVICE,
    ("service", "6.12"): [t for t in CLI_ONLY if t not in _SERVICE_KEEPS] + ["rbd"]
    + SERVICE + _SERVICE_RESTARTS_ELSEWHERE,
    ("native", "6.12"): CLI_ONLY + ["rbd"] + PACKAGE,
    ("nbdkit", "6.1"): _NBDKIT_LEAVES_OUT,
    ("nbdkit", "6.12"): _NBDKIT_LEAVES_OUT,
    ("ublk", "6.12"): ["rbd", "overlay", "ublk-detach-slow-stop"],
}


def full_tier():
    return os.environ.get("MLOOP_TEST_TIER") == "full"


def kernel_series():
    """6.1 or 6.12: the running kernel's series."""
    major, minor = os.uname().release.split(".")[:2]
    return f"{major}.{minor.split('-')[0]}"


def standard_leaves_out(kind, name):
    """Whether the standard tier leaves test NAME out for KIND on this
    kernel (see STANDARD_LEAVES_OUT)."""
    if full_tier():
        return False
    return name in STANDARD_LEAVES_OUT.get((getattr(kind, "name", ""), kernel_series()), [])


def tests_for(kind, group="main"):
    ublk = isinstance(kind, kinds.MloopUblk)
    cli = isinstance(kind, kinds.MloopCli) and not ublk
    loop = isinstance(kind, kinds.Loop)
    if group == "many":
        return ["many-devices"] if cli else []
    if group == "durable":
        if ublk:  # no supervisor to reconnect a stalled device
            return [t for t in DURABLE if t != "stall-reconnect"]
        return DURABLE if cli or loop else []
    if ublk:
        return COMMON + UBLK + RBD
    if isinstance(kind, kinds.MloopServiceInProcess):
        # The servers are mloopd itself: a kill of a device's server
        # (restart.kill_server) is a kill of mloopd, started again as
        # systemd would.  Left out: the tests that kill a server and
        # expect no new one (restart-dying, restart-hung-image: a device
        # whose restarts fail) or a process per device (SERVICE's,
        # io-flusher's), and service-attach, which starts an mloopd of
        # its own; in-process-kill kills mloopd under fio on four.
        return COMMON + [t for t in CLI_ONLY if t != "service-attach"] \
            + ["restart-fio", "restart-fsync", "restart-hostile-client",
               "in-process-kill"] + REMOTE + RBD
    if isinstance(kind, kinds.MloopService):
        # service-attach starts an mloopd of its own; the package runs
        # the installed programs, the same as the native kind's.
        return COMMON + [t for t in CLI_ONLY if t != "service-attach"] + SUPERVISED \
            + SERVICE + REMOTE + RBD
    native = cli and kind.name == "native"
    return COMMON + (CLI_ONLY + SUPERVISED + REMOTE + RBD if cli else []) \
        + (PACKAGE if native else [])


def load(name):
    path = os.path.join(HERE, f"test-{name}.py")
    spec = importlib.util.spec_from_file_location(f"test_{name.replace('-', '_')}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kmsg(text):
    try:
        with open("/dev/kmsg", "w") as f:
            f.write(f"<4>mloop-ktest: {text}\n")
    except OSError:
        pass  # only a help for reading the kernel log


# A test quiet this long gets a line saying it still runs and what: on a
# slow host a long test must not read as a hung guest.
QUIET_REPORT = 120


class StampedOutput:
    """Standard output that notes when it was last written to (tests print
    their own diagnostics too)."""

    def __init__(self, f):
        self.f = f
        self.last = time.monotonic()

    def write(self, text):
        self.last = time.monotonic()
        return self.f.write(text)

    def __getattr__(self, name):
        return getattr(self.f, name)


def out(line):
    print(line, flush=True)


def descendants():
    """Command lines of this process's descendants, oldest first."""
    children = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile, or a kernel thread
        children.setdefault(ppid, []).append((int(pid), cmd))
    found, todo = [], [os.getpid()]
    while todo:
        for pid, cmd in sorted(children.get(todo.pop(0), [])):
            found.append(cmd or f"[{pid}]")
            todo.append(pid)
    return found


def report_quiet(current, stop):
    """While STOP is unset: after QUIET_REPORT seconds without output, says
    which test runs (CURRENT[0], started at CURRENT[1]) and its processes,
    or, between two short-lived ones (power-cut's checks), the last seen."""
    seen, seen_at, seen_in = [], 0.0, None
    while not stop.wait(5):
        now = time.monotonic()
        if seen_in != current[0]:
            seen, seen_in = [], current[0]    # a new test: nothing seen yet
        procs = descendants()[:8]
        if procs:
            seen, seen_at = procs, now
        quiet = now - sys.stdout.last
        if quiet < QUIET_REPORT or current[0] is None:
            continue
        if procs:
            running = "; ".join(c[:120] for c in procs)
        elif seen:
            running = (f"no child process now, {now - seen_at:.0f} s ago: "
                       + "; ".join(c[:120] for c in seen))
        else:
            running = "no child process"
        out(f"# {current[0]}: still running after "
            f"{now - current[1]:.0f} s, quiet for {quiet:.0f} s: {running}")


def connected_devices():
    """Connected nbd devices and existing ublk ones (a ublk device exists
    only while attached)."""
    return [f"/dev/{d}" for d in sorted(os.listdir("/sys/block"))
            if (d.startswith("nbd") and kfix.nbd_in_use(f"/dev/{d}"))
            or d.startswith("ublkb")]


def kernel_lacks(kind):
    """Why the running kernel cannot run KIND, or None.  A module that is
    loaded or built in has a /sys/module directory (ublk_drv has
    parameters, so it has one either way)."""
    module = getattr(kind, "kernel_module", None)
    if module and not os.path.isdir(f"/sys/module/{module}"):
        return f"Linux {os.uname().release} has no {module}"
    return None


def main(argv):
    kind = kinds.KINDS[argv[1]]
    # Tests named one by one run whatever the tier; a group is the tier's.
    named = not (len(argv) == 3 and argv[2] in GROUPS) and len(argv) > 2
    if len(argv) == 3 and argv[2] in GROUPS:
        names = tests_for(kind, argv[2])
    else:
        names = argv[2:] or tests_for(kind)
    reason = kind.unavailable() or kernel_lacks(kind)
    failed = 0
    sys.stdout = StampedOutput(sys.stdout)
    current, stop = [None, 0.0], threading.Event()
    threading.Thread(target=report_quiet, args=(current, stop), daemon=True).start()
    if not reason and hasattr(kind, "begin"):
        kind.begin()
    for n, name in enumerate(names, 1):
        if reason:
            out(f"ok {n} - {name} # SKIP {reason}")
            continue
        if not named and standard_leaves_out(kind, name):
            out(f"ok {n} - {name} # SKIP full tier only for this kind and kernel "
                f"(MLOOP_TEST_TIER=full; docs/testing.md)")
            continue
        if not isinstance(kind, (kinds.Loop, kinds.MloopUblk)):
            # Idle kworkers for nbd's receive work, so no connect depends
            # on creating one in time (Linux 6.1: see recvwork.py).
            rounds = recvwork.warm()
            if rounds and rounds > 1:
                out(f"# {name}: warming nbd's receive workers took {rounds} rounds")
        kmsg(f"{kind.name} {name}")
        start = time.monotonic()
        current[:] = [name, start]
        busy_before = connected_devices()
        try:
            with kfix.Cleanup() as cl:
                load(name).run_test(kind, cl)
            # Cleanup ran: a test must not leave a device connected.
            left = sorted(set(connected_devices()) - set(busy_before))
            assert not left, f"left connected: {left}"
            if hasattr(kind, "between"):
                problem = kind.between()
                assert problem is None, problem
        except kfix.Skip as e:
            out(f"ok {n} - {name} # SKIP {e}")
        except Exception:
            failed += 1
            out(f"not ok {n} - {name}")
            for line in traceback.format_exc().splitlines():
                out(f"# {line}")
        else:
            out(f"ok {n} - {name}")
        out(f"# {name}: {time.monotonic() - start:.1f} s")
    stop.set()
    if not reason and hasattr(kind, "end"):
        kind.end()
    if getattr(kind, "runtime_dir", None):
        shutil.rmtree(kind.runtime_dir, ignore_errors=True)  # just .lock by now
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
