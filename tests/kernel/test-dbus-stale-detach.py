"""A user's detach of a device whose state outlived it leaves alone the
device attached at its index since.  A user's autoclear device goes
when they close it; until its supervisor's next look (every 0.5 s, or
never if the supervisor is gone) its state stays, naming the index,
while the next attach, anyone's, may be given that index (the idle
device's node is given back to root first).  The user then asks the
service to detach their image by its name: their own stale state is the
one found, and detaching it disconnected the device now there, root's
here, though the user may not detach another's (org.mloop.detach-other
is not theirs here; the supervisor is stopped to hold the window
open).  The stale state is what goes; the device stays, with its
node.  About 25 s in the VM."""
import os
import signal
import sys

from kfix import Skip, make_image, sysfs, wait_until

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import servicebus  # noqa: E402

import dbusfix  # noqa: E402
from dbusfix import one_line  # noqa: E402

import kinds  # noqa: E402

USER = servicebus.USER
# The user may attach and detach their own devices, not another's.
OWN_ONLY = """
polkit.addRule(function(action, subject) {
    if ((action.id == "org.mloop.attach" || action.id == "org.mloop.detach")
        && subject.user == "%s")
        return polkit.Result.YES;
});
""" % USER[0]


def run_test(kind, cl):
    bus = dbusfix.start(kind, cl)
    bus.set_rules(OWN_ONLY)

    image = make_image(cl, seed=11)
    os.chmod(os.path.dirname(image), 0o755)
    os.chown(image, USER[1], USER[2])
    r = bus.run_as(USER, [kinds.CLI, "attach", "--autoclear", image], text=True)
    assert r.returncode == 0, f"the user's autoclear attach: {one_line(r)}"
    dev = r.stdout.strip()
    cl.push(lambda: kind.cli("detach", dev, check=False))
    supervisor = kind.status(dev)["supervisor_pid"]
    assert supervisor > 0, f"{dev} has no supervisor"
    os.kill(supervisor, signal.SIGSTOP)
    cl.push(lambda: os.kill(supervisor, signal.SIGCONT))

    # The user's last close lets the kernel release it; the state stays.
    r = bus.run_as(USER, ["dd", f"if={dev}", "of=/dev/null", "bs=4096",
                          "count=1", "status=none"], text=True)
    assert r.returncode == 0, f"the user's read of {dev}: {one_line(r)}"
    wait_until(lambda: sysfs(dev, "pid") is None,
               f"the kernel to release autoclear {dev}", timeout=20)

    # Root's next attach is given that index.
    root_image = make_image(cl, seed=12)
    r = kind.cli(*kind.attach_args(root_image), check=False)
    assert r.returncode == 0, f"root's attach: {one_line(r)}"
    root_dev = r.stdout.strip()
    cl.push(lambda: kind.cli("detach", root_dev, check=False))
    if root_dev != dev:
        raise Skip(f"root's attach took {root_dev}, not the released {dev}")
    backend = sysfs(dev, "backend")

    bus.run_as(USER, [kinds.CLI, "detach", image], text=True)
    assert sysfs(dev, "pid") is not None and sysfs(dev, "backend") == backend, \
        f"the user's detach of their stale {dev} disconnected root's device there"
    st = os.stat(dev)
    assert st.st_uid == 0, f"{dev}, root's device, was given to uid {st.st_uid}"
    with open(dev, "rb") as f:
        f.read(4096)
    listed = kind.cli("list").stdout
    assert root_image in listed, f"root's device is not listed any more: {listed}"
    assert image not in listed, f"the user's stale device is still listed: {listed}"
    kind.cli("detach", root_dev)
