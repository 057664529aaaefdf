"""Autoclear, as loop's: `mloop attach --autoclear` detaches the device
when its last opener closes it, and the supervisor then stops the server
and removes the device's state.  `mloop mount IMG DIR` mounts an image
in one step (the data written reads back through a second mount), and
`mloop umount DIR` leaves no mount, device, process or state behind when
it returns; the helper mount.mloop (mount(8)'s `-t mloop`) does the same
as mloop mount, and a plain umount(8) of it is cleaned up after too.  A
mount that fails leaves nothing attached."""
import os

from kfix import make_image, nbd_in_use, processes_mentioning, run, tmpdir, wait_until


def gone(kind, dev, image, why):
    problems = []
    if nbd_in_use(dev):
        problems.append(f"{dev} is still connected")
    if processes_mentioning(image):
        problems.append(f"processes remain: {processes_mentioning(image)}")
    if kind.state_entries():
        problems.append(f"state remains: {kind.state_entries()}")
    assert not problems, f"{why}: " + "; ".join(problems)


def ext4_image(cl, seed):
    image = make_image(cl, seed=seed)
    run(["mkfs.ext4", "-q", "-F", image])
    return image


def device_of(mnt):
    for line in open("/proc/self/mounts"):
        f = line.split()
        if f[1] == mnt:
            return f[0]
    return None


def run_test(kind, cl):
    # 1. attach --autoclear: the first last-close detaches.
    image = make_image(cl, seed=1)
    dev = kind.cli(*kind.attach_args(image), "--autoclear").stdout.strip()
    cl.push(lambda: kind.cli("detach", dev, check=False))
    assert kind.status(dev)["device"]["autoclear"] is True, "status does not say autoclear"
    assert nbd_in_use(dev), f"{dev} went away before anyone opened it"
    with open(dev, "rb") as f:
        f.read(4096)
    wait_until(lambda: not kind.state_entries() and not processes_mentioning(image),
               "the autoclear device to be cleaned up after its last close", timeout=20)
    gone(kind, dev, image, "after the last close of an autoclear device")

    # 2. mloop mount / umount.
    image = ext4_image(cl, seed=2)
    mnt = tmpdir(cl)
    kind.cli("mount", image, mnt, "--server", kind.server)
    cl.push(lambda: os.path.ismount(mnt) and run(["umount", mnt]))
    dev = device_of(mnt)
    assert dev and dev.startswith("/dev/nbd"), f"{mnt} is mounted from {dev}"
    with open(os.path.join(mnt, "hello"), "w") as f:
        f.write("written through mloop mount\n")
    kind.cli("umount", mnt)
    assert not os.path.ismount(mnt), f"{mnt} is still mounted"
    gone(kind, dev, image, "right after mloop umount")
    kind.cli("mount", image, mnt, "-o", "ro", "--server", kind.server)
    with open(os.path.join(mnt, "hello")) as f:
        assert f.read() == "written through mloop mount\n", "the file did not survive"
    assert kind.status(device_of(mnt))["device"]["read_only"] is True, "-o ro attached read-write"
    kind.cli("umount", mnt)
    gone(kind, dev, image, "right after the second mloop umount")

    # 3. mount(8)'s helper convention, then a plain umount(8).
    helper = os.path.join(tmpdir(cl), "mount.mloop")
    os.symlink(os.environ["MLOOP_CLI"], helper)
    run([helper, image, mnt, "-o", "rw"], env=kind.env())
    dev = device_of(mnt)
    assert dev and dev.startswith("/dev/nbd"), f"mount.mloop: {mnt} is mounted from {dev}"
    run(["umount", mnt])
    wait_until(lambda: not kind.state_entries() and not processes_mentioning(image),
               "the supervisor to clean up after a plain umount", timeout=20)
    gone(kind, dev, image, "after umount(8) of a mount.mloop mount")

    # 4. A mount that fails (no filesystem) leaves nothing attached.
    blank = make_image(cl, seed=3)
    p = kind.cli("mount", blank, mnt, "--server", kind.server, check=False)
    assert p.returncode != 0, "mounting an image with no filesystem succeeded"
    assert p.stderr.strip().count("\n") == 0 and "mount" in p.stderr, f"error: {p.stderr!r}"
    assert not kind.state_entries() and not processes_mentioning(blank), \
        f"a failed mount left {kind.state_entries()} {processes_mentioning(blank)}"
