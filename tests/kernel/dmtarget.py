"""Device-mapper devices for the durability tests: a scratch disk, and the
targets the filesystem community tests with (dm-log-writes, dm-flakey,
dm-delay) stacked on it, so a test can serve an image that loses power,
fails or is slow on command.

    disk = scratch_disk(cl, 64 << 20)          # a loop device over a file
    dm = Dm.create(cl, "linear", linear(disk))  # /dev/dm-N, removed by cl
    dm.swap(flakey(disk, "error_writes"))       # from now on, writes fail
    dm.swap(linear(disk))                       # and now they don't

Tables are in 512-byte sectors, whatever the device's block size.  There is
no udev in the test VM, so every dmsetup call passes --noudevsync.
"""
import os
import shutil

import kfix
from kfix import Skip, run


def load(target):
    """Makes the device-mapper TARGET (linear, log-writes, flakey, delay) available,
    or raises Skip saying why it cannot be."""
    if shutil.which("dmsetup") is None:
        raise Skip("dmsetup is not installed")

    def have():
        return target in run(["dmsetup", "targets"], check=False).stdout.split()
    if have():
        return
    # In the VM the guest kernel's modules are not under /lib/modules (the
    # host's are): tests/vm/init says where they are.
    moddir = os.environ.get("MLOOP_VM_MODDIR")
    # linear is part of dm-mod itself.
    module = "dm-mod" if target == "linear" else f"dm-{target}"
    cmd = ["modprobe"] + (["-d", moddir] if moddir else []) + [module]
    p = run(cmd, check=False)
    if p.returncode != 0 or not have():
        raise Skip(f"no dm-{target} target: {(p.stderr or p.stdout).strip()}")


def losetup(cl, path):
    """A loop device over PATH (buffered: it stands for a disk, and the
    page cache below it is flushed by the flushes that reach it)."""
    dev = run(["losetup", "--find", "--show", path]).stdout.strip()
    cl.push(run, ["losetup", "--detach", dev])
    return dev


def scratch_disk(cl, size, directory=None):
    """A loop device over a new sparse file of SIZE bytes; returns the
    device.  The file lives in DIRECTORY, or a fresh one CL removes."""
    path = os.path.join(directory or kfix.tmpdir(cl), "scratch.img")
    with open(path, "wb") as f:
        f.truncate(size)
    return losetup(cl, path)


def sectors(dev):
    return int(run(["blockdev", "--getsz", dev]).stdout)


def linear(dev):
    """A table passing everything through to DEV."""
    return f"0 {sectors(dev)} linear {dev} 0"


def flakey(dev, *features, up=0, down=3600):
    """A dm-flakey table over DEV: UP seconds well, then DOWN seconds
    unreliable, repeating.  The default is unreliable for an hour, i.e.
    until the table is swapped.  Unreliable means every request fails,
    unless FEATURES say otherwise ("error_writes": only writes fail;
    "drop_writes": writes are thrown away and reported done)."""
    feats = f" {len(features)} {' '.join(features)}" if features else ""
    return f"0 {sectors(dev)} flakey {dev} 0 {up} {down}{feats}"


def delay(dev, ms):
    """A dm-delay table over DEV holding every request MS milliseconds."""
    return f"0 {sectors(dev)} delay {dev} 0 {ms}"


class Dm:
    """A device-mapper device NAME at PATH, removed by the cleanup stack
    it was created with (or earlier, by remove())."""

    def __init__(self, name, path):
        self.name, self.path = name, path
        self.removed = False

    @classmethod
    def create(cls, cl, target, table, name=None):
        load(target)
        name = name or f"mloop-ktest-{target}-{os.getpid()}"
        run(["dmsetup", "create", name, "--noudevsync", "--table", table])
        blk = run(["dmsetup", "info", "-c", "--noheadings", "-o", "blkdevname", name])
        dm = cls(name, f"/dev/{blk.stdout.strip()}")
        cl.push(dm.remove)
        kfix.wait_until(lambda: os.path.exists(dm.path), f"{dm.path} to appear")
        return dm

    def swap(self, table, target=None, lockfs=True):
        """Replaces the table: requests in flight finish on the old one
        (suspend waits for them), later ones see the new one.  LOCKFS
        False: a filesystem mounted on the device is not frozen (and so
        not synced) first, so its dirty pages meet the new table."""
        if target:
            load(target)
        run(["dmsetup", "load", self.name, "--table", table])
        run(["dmsetup", "suspend", "--noudevsync"] + ([] if lockfs else ["--nolockfs"])
            + [self.name])
        run(["dmsetup", "resume", "--noudevsync", self.name])

    def message(self, *words):
        run(["dmsetup", "message", self.name, "0", *words])

    def remove(self):
        if not self.removed:
            self.removed = True
            run(["dmsetup", "remove", "--noudevsync", self.name])
