#!/usr/bin/python3
"""mloop-dbus with every closer waiting: a user fills the service's 32
closer threads (dbus/descriptors.h) with descriptors of a FUSE file
whose server never answers the service's FLUSH (33
org.freedesktop.DBus.Peer.Pings carrying one each, which anyone may
send), so one more waits open in the service, and every process it
starts from then on hangs at its exec, closing its copy.  The service
loads the nbd module once, as it starts, before it joins the bus (a
modprobe of the test's own on its PATH says when it ran), so another
user's attach, which on a kernel without the module fails for want of
an NBD client, is answered at once: its device thread runs no modprobe
(before, it waited for one hung at its exec for as long as the FUSE
server liked).

About 1 s (the bus and polkitd, 33 pings, one attach; before the
service loaded the module as it started, the attach went unanswered and
the test took 11 s).
Where the kernel has an NBD client, the attach would go on to start a
supervisor, which hangs the same way (device/server_process.c kills it
after the start's 60 s): that part is skipped with a line saying so.
Skipped without root, /dev/fuse or python3-gi; the client suite (the
standard and full tiers)."""
import os
import subprocess
import sys

import harness
import servicebus
from harness import check
from stuck_fuse import StuckFuse, skip_unless_possible

SERVICE = os.environ.get("MLOOP_DBUS_BIN", "")
SRC_DBUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "dbus")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL = [sys.executable, os.path.join(TESTS, "dbus_call.py")]
USER, OTHER = servicebus.USER, servicebus.OTHER
# dbus/descriptors.h
MAX_CLOSERS = 32
# How long another user's call may take while the closers wait.
ANSWER_S = 10
NOT_ATTACHED = "ERROR /dev/nbd0 is not attached by mloop"
# What a kernel without an NBD client makes of an attach.
NO_NBD = "the kernel has no NBD client"


def call_as(bus, user, args, timeout=ANSWER_S):
    try:
        r = bus.run_as(user, CALL + list(args), timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except subprocess.TimeoutExpired:
        return f"no answer within {timeout} s"


def fake_modprobe(work):
    """A directory with a modprobe that says it ran, in the file it
    returns, and loads nothing."""
    bindir = os.path.join(work, "bin")
    os.mkdir(bindir)
    log = os.path.join(work, "modprobe.log")
    with open(log, "w"):
        pass
    path = os.path.join(bindir, "modprobe")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho \"modprobe $*\" >> {log}\nexit 1\n")
    os.chmod(path, 0o755)
    return bindir, log


def runs(log):
    with open(log) as f:
        return f.read().splitlines()


def run(bus, work):
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)
    bindir, log = fake_modprobe(work)
    bus.set_service_args([], env={"PATH": bindir + ":/usr/sbin:/usr/bin:/sbin:/bin"})
    image = os.path.join(work, "plain.img")
    with open(image, "wb") as f:
        f.truncate(1 << 20)
    os.chmod(image, 0o644)

    out = call_as(bus, OTHER, ["detach", "/dev/nbd0"], timeout=20)
    check("the service answers before", out == NOT_ATTACHED, out)
    check("the service loads the nbd module as it starts", runs(log) == ["modprobe -q nbd"],
          runs(log))

    fuse = StuckFuse(work, "closers", USER)
    try:
        out = call_as(bus, USER, ["carrying", fuse.image, "ping", str(MAX_CLOSERS + 1)],
                      timeout=60)
        check(f"{MAX_CLOSERS + 1} pings carrying the FUSE file are answered",
              out == f"{MAX_CLOSERS + 1} x OK", out)
        check("every closer waits for the FUSE server",
              fuse.service_stuck(MAX_CLOSERS), f"{fuse.stuck()} waiting")
        if os.path.exists("/sys/module/nbd"):
            print("# SKIP the attach: this kernel has an NBD client, and the "
                  "supervisor it would start hangs at its exec")
        else:
            out = call_as(bus, OTHER, ["attach", "ro", image, image, "read-only=true"])
            print(f"# the attach: {out}")
        check("another user's attach is answered while every closer waits",
                  out.startswith("ERROR") and NO_NBD in out, out)
        check("no modprobe from the service's device thread",
              runs(log) == ["modprobe -q nbd"], runs(log))
    finally:
        fuse.close()


def main():
    skip_unless_possible(harness.skip)
    servicebus.run_on_bus(SERVICE, SRC_DBUS, "mloop-closers-full-", run, harness.skip)
    harness.exit_if_failed()


main()
