"""Runs the kernel tests for one kind (see kinds.py) and prints one TAP
result line per test, flushed at once; runs as root where the kernel has
nbd and loop (in the test VM, or natively).

  runner.py KIND [GROUP | TEST...]   (GROUP: main, the default, or durable)

The plan line ("1..N") is left to run-kernel-tests, which also adds results
for what it sees from outside (a VM that died, the kernel log).  Before each
test a marker goes to the kernel log (/dev/kmsg), so kernel messages can be
attributed to the test that caused them.
"""
import importlib.util
import os
import shutil
import sys
import time
import traceback

import kfix
import kinds
import recvwork

HERE = os.path.dirname(os.path.abspath(__file__))
# Every kind runs these (a-f of the issue).
COMMON = ["attach-geometry", "ext4-roundtrip", "fio-verify", "dd-readers",
          "read-only", "detach-clean"]
# The mloop command line's own contract, for the CLI kinds.
CLI_ONLY = ["cli-block-size", "cli-list-status", "cli-detach-forms", "cli-errors",
            "attach-busy", "offset-window", "partitions", "queue-settings",
            "autoclear", "resize", "many-devices"]
# A device that survives its server (mloop-supervisor), for the CLI kinds.
SUPERVISED = ["restart-fio", "restart-fsync", "restart-dying", "restart-hostile-client",
              "io-flusher"]
# Durability through the kernel, on device-mapper targets under the image
# (dmtarget.py): a power cut replayed at every flush, a failing disk, one
# that drops writes, a slow one, one that stalls past the request timeout
# (CLI kinds only: the supervisor reconnects), a full filesystem.  For the
# CLI kinds and for loop, the reference; the stock client adds nothing here.
DURABLE = ["power-cut", "power-cut-early-ack", "failing-disk", "dropped-writes",
           "slow-disk", "stall-reconnect", "out-of-space"]
# Serving to other machines, through this machine's loopback; a remote
# device that survives its server's restarts (its supervisor reconnects).
REMOTE = ["remote-attach", "remote-restart"]


# The durability tests take a VM of their own (they alone take as long as
# the rest together): run-kernel-tests KIND SERIES durable.
GROUPS = ["main", "durable"]


# What `mloop attach --transport ublk` runs beyond COMMON: mloop-ublk on
# its own (ublk-smoke: its contract, discard and zero, refusals, user
# recovery), the command line's contract where it is the same for both
# transports, and a device that survives its server (ublk's user
# recovery, through the supervisor).
UBLK = ["ublk-smoke", "ublk-cli", "restart-fio", "restart-full-queue", "restart-fsync",
        "restart-dying", "restart-hung-image"]


def tests_for(kind, group="main"):
    ublk = isinstance(kind, kinds.MloopUblk)
    cli = isinstance(kind, kinds.MloopCli) and not ublk
    loop = isinstance(kind, kinds.Loop)
    if group == "durable":
        if ublk:  # no supervisor to reconnect a stalled device
            return [t for t in DURABLE if t != "stall-reconnect"]
        return DURABLE if cli or loop else []
    if ublk:
        return COMMON + UBLK
    return COMMON + (CLI_ONLY + SUPERVISED + REMOTE if cli else [])


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


def out(line):
    print(line, flush=True)


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
    if len(argv) == 3 and argv[2] in GROUPS:
        names = tests_for(kind, argv[2])
    else:
        names = argv[2:] or tests_for(kind)
    reason = kind.unavailable() or kernel_lacks(kind)
    failed = 0
    for n, name in enumerate(names, 1):
        if reason:
            out(f"ok {n} - {name} # SKIP {reason}")
            continue
        if not isinstance(kind, (kinds.Loop, kinds.MloopUblk)):
            # Idle kworkers for nbd's receive work, so no connect depends
            # on creating one in time (Linux 6.1: see recvwork.py).
            rounds = recvwork.warm()
            if rounds and rounds > 1:
                out(f"# {name}: warming nbd's receive workers took {rounds} rounds")
        kmsg(f"{kind.name} {name}")
        start = time.monotonic()
        busy_before = connected_devices()
        try:
            with kfix.Cleanup() as cl:
                load(name).run_test(kind, cl)
            # Cleanup ran: a test must not leave a device connected.
            left = sorted(set(connected_devices()) - set(busy_before))
            assert not left, f"left connected: {left}"
        except kfix.Skip as e:
            out(f"ok {n} - {name} # SKIP {e}")
        except Exception as e:
            failed += 1
            out(f"not ok {n} - {name}")
            for line in traceback.format_exc().splitlines():
                out(f"# {line}")
        else:
            out(f"ok {n} - {name}")
        out(f"# {name}: {time.monotonic() - start:.1f} s")
    if getattr(kind, "runtime_dir", None):
        shutil.rmtree(kind.runtime_dir, ignore_errors=True)  # just .lock by now
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
