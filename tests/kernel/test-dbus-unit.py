"""test-dbus-attach's whole scenario with the service run as a machine
booted with systemd runs it: the bus asks systemd (a real manager,
tests/unitmanager.py) to start mloop-dbus.service, the build tree's unit
with its sandbox, and systemd waits for the service's bus name.  Attach,
IO, the node handed to its user and back, the server's restart, the
service's SIGKILL and restart, a read-only attach and polkit's refusal
all work in the sandbox, and the kernel confirms it holds the service
and a device's server: no new privileges, a seccomp filter, the unit's
capability bounding set, /usr and /home read-only.  20-64 s in
the VM (full tier)."""
import importlib.util
import os
import sys

import kinds
from kfix import Skip

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unitmanager  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _scenario():
    spec = importlib.util.spec_from_file_location(
        "dbus_attach", os.path.join(HERE, "test-dbus-attach.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built_unit():
    return os.path.join(os.path.dirname(os.path.dirname(kinds.CLI)), "dbus", "mloop-dbus.service")


def mount_options(pid, where):
    """The options of the mount at WHERE as PID sees it, or None."""
    found = None
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == where:
                found = fields[5]      # the last mount there is the one seen
    return found


# What attaching needs: the NBD netlink family and ioctls (SYS_ADMIN),
# modprobe (SYS_MODULE), the servers' IO threads (SYS_RESOURCE) and
# --mlock (IPC_LOCK), the node handed to its user and back (CHOWN,
# FOWNER, DAC_OVERRIDE), a path looked for with the caller's rights
# (SETUID, SETGID).
SERVICE_CAPS = ["CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RESOURCE", "CAP_IPC_LOCK",
                "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE", "CAP_SETUID", "CAP_SETGID"]


def check_sandbox():
    # What the unit keeps of what this machine has.
    want = unitmanager.capability_mask(SERVICE_CAPS) & \
        int(unitmanager.process_status(os.getpid())["CapBnd"], 16)

    def check(pid):
        st = unitmanager.process_status(pid)
        what = f"pid {pid} ({st['Name']})"
        assert st["NoNewPrivs"] == "1", f"{what} may gain privileges"
        assert st["Seccomp"] == "2", f"{what} has no seccomp filter"
        assert int(st["CapBnd"], 16) == want, f"{what}: CapBnd {st['CapBnd']}, not {want:016x}"
        usr = mount_options(pid, "/usr")
        assert usr and usr.split(",")[0] == "ro", f"{what}: /usr is {usr}"
        home = mount_options(pid, "/home")
        assert home and home.split(",")[0] == "ro", f"{what}: /home is {home}"
    return check


def run_test(kind, cl):
    unit = built_unit()
    if not os.path.exists(unit):
        raise Skip(f"{unit} is not built (no systemd pkg-config file at setup)")
    try:
        _scenario().run_test(kind, cl, unit=unit, check_sandbox=check_sandbox())
    except unitmanager.Unavailable as e:
        raise Skip(str(e))
