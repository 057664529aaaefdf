"""Another user's read-only device never keeps an image from its owner,
nor from root.  An image is readable by others (a home's default umask
makes it so); another user attaches it read-only through mloop's D-Bus
service (tests/servicebus.py), which any user at the machine may.  The
image's owner then attaches it read-write, and root attaches it with
`mloop attach`: a read-only device never writes, so it cannot corrupt
what either writes, and refusing them let any user keep anyone's
readable image, root's too, from being attached for as long as they
liked.  The owner's `mloop detach FILE` then finds their own device,
not the other user's.  About 15 s in the VM."""
import os
import sys

from kfix import make_image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import servicebus  # noqa: E402

import dbusfix  # noqa: E402
from dbusfix import one_line  # noqa: E402

import kinds  # noqa: E402

USER, OTHER = servicebus.USER, servicebus.OTHER


def run_test(kind, cl):
    bus = dbusfix.start(kind, cl)
    bus.set_rules(servicebus.ALLOW_BOTH_ATTACH)

    image = make_image(cl, seed=7)
    os.chmod(os.path.dirname(image), 0o755)
    os.chown(image, USER[1], USER[2])
    os.chmod(image, 0o644)

    # Another user pins it read-only.
    r = bus.run_as(OTHER, [kinds.CLI, "attach", "--read-only", image], text=True)
    assert r.returncode == 0, f"another user's read-only attach: {one_line(r)}"
    pinned = r.stdout.strip()
    cl.push(lambda: kind.cli("detach", pinned, check=False))

    # Its owner attaches it read-write all the same.
    r = bus.run_as(USER, [kinds.CLI, "attach", image], text=True)
    assert r.returncode == 0, \
        f"the owner's attach, beside another user's read-only {pinned}: {one_line(r)}"
    mine = r.stdout.strip()
    cl.push(lambda: kind.cli("detach", mine, check=False))

    # Their detach by the file's name finds their own device.
    r = bus.run_as(USER, [kinds.CLI, "detach", image], text=True)
    assert r.returncode == 0, f"the owner's detach of {image}: {one_line(r)}"
    listed = kind.cli("list").stdout
    assert pinned in listed and mine not in listed, \
        f"the owner's detach by name detached another device: {listed}"

    # So does root, with the command.
    r = kind.cli(*kind.attach_args(image), check=False)
    assert r.returncode == 0, \
        f"root's attach, beside another user's read-only {pinned}: {one_line(r)}"
    kind.cli("detach", r.stdout.strip())
    kind.cli("detach", pinned)
