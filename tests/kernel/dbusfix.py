"""What the kernel tests of mloop-dbus share: the built service on a
private system bus with a real dbus-daemon and polkitd
(tests/servicebus.py), for the `mloop attach` kinds."""
import os
import sys

from kfix import Skip

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import servicebus  # noqa: E402

import kinds  # noqa: E402

SRC_DBUS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "dbus")


def service_bin():
    if os.environ.get("MLOOP_DBUS_BIN"):
        return os.environ["MLOOP_DBUS_BIN"]
    return os.path.join(os.path.dirname(os.path.dirname(kinds.CLI)), "dbus", "mloop-dbus")


def one_line(r):
    """A finished command's output and errors, as one stripped string."""
    out = r.stdout + r.stderr
    return (out.decode(errors="replace") if isinstance(out, bytes) else out).strip()


def start(kind, cl, **options):
    """mloop-dbus on its private bus for KIND (OPTIONS: ServiceBus's,
    unit= say), closed by CL; a Skip when its parts cannot run here."""
    try:
        bus = servicebus.ServiceBus(service_bin(), SRC_DBUS, env=kind.env(), **options)
    except servicebus.Unavailable as e:
        raise Skip(str(e))
    bus.__enter__()
    cl.push(bus.close)
    return bus
