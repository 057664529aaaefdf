"""mloop attach --overlay: two devices share one read-only base, one with
a named overlay, one with a temporary one.  Each starts as the base's
bytes; fio writes and verifies through both at once while the first's
server is SIGKILLed (the supervisor restarts it on the same overlay), and
the base's bytes never change.  The named overlay keeps the device's
bytes across a detach and a new attach; the temporary one is deleted at
detach, by mloop detach or by autoclear; an overlay in use is refused
in one line.  list --json and
status show the overlay.  While devices use it, the base is locked
(shared) by their servers, also after a restart, which is what keeps a
commit off it.  mloop overlay commit is refused while a device uses the
overlay or its base, also under a name that no longer leads to it (a
hard link removed after the attach), then makes
the base read as the overlay device did."""
import errno
import fcntl
import os

import fioverify
import restart
from kfix import digest, make_image, tmpdir, wait_until

MIB = 1 << 20
SIZE = 64 * MIB


def overlay_args(kind, image, overlay, timeout=10):
    """Attach arguments with OVERLAY and a short timeout, as
    restart.attach gives them, for a server that may be killed."""
    flag = "--dead-timeout" if kind.name == "ublk" else "--timeout"
    return kind.attach_args(image) + ["--overlay", overlay, flag, str(timeout)]


def device_digest(dev):
    return digest(dev, 0, SIZE)


def run_test(kind, cl):
    image = make_image(cl, size=SIZE, fill=SIZE, seed=11)
    base = digest(image)
    named = os.path.join(tmpdir(cl), "named.overlay")

    a = kind.attach(cl, image, args=overlay_args(kind, image, named))
    b = kind.attach(cl, image, args=overlay_args(kind, image, "temp"))
    sa, sb = kind.status(a.device), kind.status(b.device)
    assert sa["device"].get("overlay") == named, f"status: {sa['device']}"
    temp = sb["device"].get("overlay")
    assert temp and temp.startswith("/var/tmp/") and sb["device"].get("overlay_temporary"), \
        f"status: {sb['device']}"
    assert os.path.exists(named) and os.path.exists(temp), "an overlay was not made"
    listed = kind.cli("list", "--json").stdout
    assert named in listed and temp in listed, f"list --json: {listed}"
    assert device_digest(a.device) == base == device_digest(b.device), \
        "a fresh overlay device does not read as its base"

    # Both written at once; the first's server is killed mid-round.
    other = fioverify.start_round(b.device, cl)
    took, _ = fioverify.under_kills(a.device, cl, 1,
                                    lambda: restart.kill_server(kind, a.device))
    fioverify.check_round(other)
    assert digest(image) == base, "the base changed"
    assert locked_by_others(image), \
        "the base is not locked while its overlay devices run"

    # A named overlay outlives its device.
    p = kind.cli(*overlay_args(kind, image, named), check=False)
    lines = p.stderr.splitlines()
    assert p.returncode != 0 and len(lines) == 1 and "is in use by " + a.device in lines[0], \
        f"a second device on one overlay: exit {p.returncode}, {p.stderr!r}"
    written = device_digest(a.device)
    a.detach()
    a = kind.attach(cl, image, args=overlay_args(kind, image, named))
    assert device_digest(a.device) == written, "the overlay lost writes across detach"
    b.detach()
    assert not os.path.exists(temp) and not os.path.exists(os.path.dirname(temp)), \
        f"the temporary overlay {temp} stayed after detach"
    a.detach()
    assert digest(image) == base, "the base changed"

    # Detached by its last close (autoclear, NBD only): the temporary
    # overlay goes too.
    if kind.name != "ublk":
        dev = kind.cli(*overlay_args(kind, image, "temp"), "--autoclear").stdout.strip()
        cl.push(lambda: kind.cli("detach", dev, check=False))
        temp = kind.status(dev)["device"]["overlay"]
        with open(dev, "rb") as f:
            f.read(4096)
        wait_until(lambda: not os.path.exists(os.path.dirname(temp)),
                   "an autoclear device's temporary overlay to go after its last close",
                   timeout=20)

    # mloop overlay commit: refused while a device uses the overlay or
    # its base; then the base takes the overlay's bytes.
    a = kind.attach(cl, image, args=overlay_args(kind, image, named))
    refused(kind, ["overlay", "commit", named], "is in use by " + a.device)
    a.detach()
    b = kind.attach(cl, image, args=overlay_args(kind, image, "temp"))
    refused(kind, ["overlay", "commit", named], "the overlay's base, is in use by " + b.device)
    refused(kind, ["overlay", "discard", kind.status(b.device)["device"]["overlay"]],
            "is in use by " + b.device)
    b.detach()
    # The base attached under a name that no longer leads to it (a D-Bus
    # caller's own path, an image renamed since) is still the base: the
    # device records its device and inode.
    link = os.path.join(tmpdir(cl), "same-image.img")
    os.link(image, link)
    c = kind.attach(cl, link, args=kind.attach_args(link))
    os.unlink(link)
    refused(kind, ["overlay", "commit", named], "the overlay's base, is in use by " + c.device)
    c.detach()
    assert digest(image) == base, "a refused commit changed the base"
    kind.cli("overlay", "commit", named)
    assert digest(image) == written and not os.path.exists(named), \
        "after commit the base does not read as the overlay device did"
    print(f"# overlay: server restarted in {took[0]:.1f} s under fio verify; "
          "base unchanged, named overlay kept, temporary one deleted, "
          "committed into the base", flush=True)


def locked_by_others(path):
    """Whether another process holds a lock on PATH."""
    # The servers' lock is an open file description lock (fileio.h);
    # a POSIX write lock conflicts with it, and needs PATH open for
    # writing, as the merge's exclusive lock does.
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return True
    finally:
        os.close(fd)


def refused(kind, args, expect):
    p = kind.cli(*args, check=False)
    lines = p.stderr.splitlines()
    assert p.returncode != 0 and len(lines) == 1 and expect in lines[0], \
        f"mloop {' '.join(args)}: exit {p.returncode}, {p.stderr!r}"
